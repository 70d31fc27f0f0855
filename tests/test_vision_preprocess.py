"""Image preprocessing against transformers' Qwen2-VL image processor (the one Qwen3.5/3.6 use)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.vision.config import VisionConfig
from common.vision.preprocess import image_tokens, preprocess, smart_resize

from .vision_helpers import MAX_PIXELS, MIN_PIXELS, hf_image_processor, save_png, synthetic_image

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

# both sides rescale in float64 and normalise in float32: the same values, up to one rounding
PIXEL_ATOL = 1e-6

CFG = VisionConfig(projector_type="qwen3vl_merger", hidden_size=32, ffn_size=48, n_blocks=2, n_heads=2,
                   patch_size=16, merge_size=2, n_positions=36, projection_dim=64, image_mean=(0.5, 0.5, 0.5),
                   image_std=(0.5, 0.5, 0.5), eps=1e-6, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.mark.parametrize("height,width", [(64, 96), (200, 120), (1, 150), (33, 31), (4000, 3000),
                                          (90, 10), (512, 512), (2000, 20)])
def test_smart_resize_as_transformers(height, width):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
    assert smart_resize(height, width, 32, MIN_PIXELS, MAX_PIXELS) == hf_smart_resize(
        height, width, 32, MIN_PIXELS, MAX_PIXELS)


def test_smart_resize_keeps_multiples_of_32_within_the_limits():
    rng = np.random.default_rng(0)
    for height, width in rng.integers(8, 5000, (200, 2)):
        if max(height, width) / min(height, width) > 200:
            continue
        h, w = smart_resize(int(height), int(width), 32, MIN_PIXELS, MAX_PIXELS)
        assert h % 32 == 0 and w % 32 == 0
        assert MIN_PIXELS <= h * w <= MAX_PIXELS


def test_smart_resize_refuses_extreme_aspect_ratios():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2010, 32, MIN_PIXELS, MAX_PIXELS)


def _png(tmp_path, height, width, seed, mode="RGB"):
    pixels = synthetic_image(height, width, seed)
    if mode == "RGBA":
        alpha = np.linspace(0, 255, height * width).reshape(height, width, 1).astype(np.uint8)
        Image.fromarray(np.concatenate([pixels, alpha], axis=-1), "RGBA").save(tmp_path / "a.png")
        path = tmp_path / "a.png"
    else:
        path = save_png(pixels, tmp_path / f"{height}x{width}.png")
    image = Image.open(path)
    image.load()
    return image


@pytest.mark.parametrize("height,width,mode", [(64, 96, "RGB"), (200, 120, "RGB"), (64, 64, "RGBA"),
                                               (96, 128, "RGB"), (50, 400, "RGB")])
def test_patches_and_grid_as_transformers(tmp_path, height, width, mode):
    image = _png(tmp_path, height, width, seed=height + width, mode=mode)
    ours = preprocess(image, CFG)
    theirs = hf_image_processor()(images=[image], return_tensors="np")
    assert theirs["image_grid_thw"].tolist() == [[1, ours.grid_h, ours.grid_w]]
    assert ours.pixels.shape == theirs["pixel_values"].shape
    assert ours.pixels.dtype == np.float32
    np.testing.assert_allclose(ours.pixels, theirs["pixel_values"], rtol=0, atol=PIXEL_ATOL)
    h, w = smart_resize(height, width, 32, MIN_PIXELS, MAX_PIXELS)
    assert ours.n_tokens == (h // 32) * (w // 32) == image_tokens(height, width, CFG)
    assert ours.n_tokens * 4 == hf_image_processor().get_number_of_image_patches(height, width)


def test_patches_follow_the_merge_blocks(tmp_path):
    # a 64 x 64 image is 4 x 4 patches, 2 x 2 merge blocks: the first four patches are the top-left block
    pixels = np.zeros((64, 64, 3), np.uint8)
    for r in range(4):
        for c in range(4):
            pixels[16 * r:16 * (r + 1), 16 * c:16 * (c + 1)] = 10 * (4 * r + c)
    cfg = dataclasses.replace(CFG, min_pixels=64 * 64)
    patches = preprocess(Image.fromarray(pixels), cfg)
    order = np.round((patches.pixels[:, 0] * 0.5 + 0.5) * 255 / 10).astype(int).tolist()
    assert order == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    # the temporal halves of a patch are the same still image
    p = patches.pixels.reshape(16, 3, 2, 16, 16)
    assert np.array_equal(p[:, :, 0], p[:, :, 1])


def test_a_large_image_is_held_to_max_pixels():
    cfg = dataclasses.replace(CFG, max_pixels=64 * 32 * 32)
    image = Image.fromarray(synthetic_image(1000, 700, 3))
    patches = preprocess(image, cfg)
    assert patches.n_tokens <= 64
    assert patches.grid_h * 16 * patches.grid_w * 16 <= cfg.max_pixels
