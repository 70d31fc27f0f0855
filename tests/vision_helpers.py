"""Tiny random Qwen3_5MoeForConditionalGeneration checkpoints with a vision tower (or, with `dense`,
Qwen3_5ForConditionalGeneration: the same tower beside the dense text model), and synthetic images.

The vision tower keeps the real patch (16), temporal patch (2) and merge (2), so that images are real
pixels; its widths and depth are tiny. The text model's rotary part is 16 dims wide (8 frequencies),
so that the mRoPE sections [3, 3, 2] give each of T, H and W more than one frequency.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB, HIDDEN = 300, 64
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 290, 291, 292, 293
MROPE_SECTION = [3, 3, 2]
SIZES_FOR_INTEROP = [(64, 96), (200, 120)]
PREPROCESSOR = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessorFast",
                "processor_class": "Qwen3VLProcessor"}
# llama.cpp's limits for Qwen-VL projectors: 8 to 4096 image tokens of 32 x 32 pixels
MIN_PIXELS, MAX_PIXELS = 8 * 32 * 32, 4096 * 32 * 32


def tiny_vl_config(layers: int = 4, dense: bool = False):
    import transformers as tf
    ffn = dict(intermediate_size=96) if dense else dict(
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, **ffn,
                rms_norm_eps=1e-6, max_position_embeddings=4096, initializer_range=0.08,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": MROPE_SECTION, "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=HIDDEN,
                  num_position_embeddings=36, hidden_act="gelu_pytorch_tanh")
    return (tf.Qwen3_5Config if dense else tf.Qwen3_5MoeConfig)(
                               text_config=text, vision_config=vision, image_token_id=IMAGE_PAD,
                               video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
                               vision_end_token_id=VISION_END)


def build_tiny_vl_checkpoint(out_dir: Path, seed: int = 0, dense: bool = False):
    """Saves the checkpoint (with preprocessor_config.json, which llama.cpp's converter reads the
    image mean and std from) and returns the transformers model, in eval mode."""
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    cls = tf.Qwen3_5ForConditionalGeneration if dense else tf.Qwen3_5MoeForConditionalGeneration
    model = cls(tiny_vl_config(dense=dense)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                if "norm" in name and name.endswith("weight"):
                    p.normal_(1.0, 0.2)
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.1)
                else:
                    p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith(("dt_bias", "A_log")):
                p.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    (Path(out_dir) / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return model


def synthetic_image(height: int, width: int, seed: int) -> np.ndarray:
    """uint8 RGB [height, width, 3]: a gradient per channel plus noise, so that resizing matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1),
                     127 + 120 * np.sin((x + y) / 7.0)], axis=-1)
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


def save_png(pixels: np.ndarray, path: Path) -> Path:
    from PIL import Image
    Image.fromarray(pixels, "RGB").save(path, format="PNG")
    return path


def hf_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": MIN_PIXELS,
                                                               "longest_edge": MAX_PIXELS})


class TinyVL:
    """A tiny checkpoint converted once: the transformers model, the f32 text GGUF, the f32 mmproj."""

    def __init__(self, root: Path, dense: bool = False):
        from common.model.convert import convert
        from common.model.convert.mmproj import convert_mmproj
        self.root = root
        self.hf_dir = root / "hf"
        self.model = build_tiny_vl_checkpoint(self.hf_dir, dense=dense)
        self.text_path, self.mmproj_path = root / "text-f32.gguf", root / "mmproj-f32.gguf"
        convert(self.hf_dir, self.text_path, "f32", progress=False)
        convert_mmproj(self.hf_dir, self.mmproj_path, "f32", progress=False)

    def image(self, height: int, width: int, seed: int):
        """A synthetic PNG written to disk and read back, as a client's file would be."""
        from PIL import Image
        path = save_png(synthetic_image(height, width, seed), self.root / f"image-{height}x{width}-{seed}.png")
        with Image.open(path) as image:
            image.load()
            return image


def prompt_with_images(n_tokens: list[int], seed: int = 0, text: int = 5, tail: int = 7) -> list[int]:
    """Text, then each image as vision-start, its image tokens and vision-end, then more text."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for n in n_tokens:
        ids += rng.integers(0, 280, text).tolist() + [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
    return ids + rng.integers(0, 280, tail).tolist()


def hf_image_inputs(ids: list[int], images) -> dict:
    """The transformers model's inputs for a prompt with images."""
    import torch
    features = hf_image_processor()(images=images, return_tensors="pt")
    return {"input_ids": torch.tensor([ids]), "pixel_values": features["pixel_values"],
            "image_grid_thw": features["image_grid_thw"],
            "mm_token_type_ids": torch.tensor([[1 if t == IMAGE_PAD else 0 for t in ids]])}


MMPROJ_TYPES = ("f32", "f16", "q8_0")


def tiny_towers(root: Path) -> tuple["TinyVL", dict]:
    """The tiny vision model under root, and its tower as an mmproj of each of MMPROJ_TYPES (f32 is
    the file TinyVL writes; the others come from fermium convert)."""
    from common.model.convert.mmproj import convert_mmproj
    from common.vision.tensors import MmprojFile
    vl = TinyVL(root)
    files = {"f32": vl.mmproj_path}
    for t in MMPROJ_TYPES[1:]:
        files[t] = convert_mmproj(vl.hf_dir, vl.root / f"mmproj-{t}.gguf", t, progress=False).path
    return vl, {t: MmprojFile(p) for t, p in files.items()}


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """The largest difference relative to the reference's largest magnitude."""
    return float(np.abs(ours - ref).max() / np.abs(ref).max())
