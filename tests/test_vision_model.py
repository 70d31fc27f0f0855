"""The reference vision encoder and the reference text model with images, against transformers'
Qwen3_5MoeForConditionalGeneration and the dense Qwen3_5ForConditionalGeneration on tiny random
models: images of 64x96 and 200x120 plus text."""
from __future__ import annotations

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.reference.multimodal import ImageEmbedding, place_images, text_input
from common.reference.ops import rope_mrope, rope_neox
from common.reference.vision import VisionEncoder, patch_rows_cols
from common.vision.preprocess import preprocess
from common.vision.tensors import MmprojFile

from .vision_helpers import IMAGE_PAD, VISION_END, VISION_START, TinyVL, hf_image_inputs, prompt_with_images

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SIZES = [(64, 96), (200, 120)]
GREEDY_STEPS = 8
# float32 on both sides, other summation orders (and erf to 1.5e-7): 1e-5 of the largest output value
ENCODER_REL_TOL = 1e-5
# as tests/test_reference_parity.py: 1e-4 of the largest logit
LOGIT_REL_TOL = 1e-4
# what leaving a part out must move the logits by, so that the parity above could fail
MATTERS = 100 * LOGIT_REL_TOL


@pytest.fixture(scope="module", params=["moe", "dense"])
def vl(tmp_path_factory, request):
    tiny = TinyVL(tmp_path_factory.mktemp("vl"), dense=request.param == "dense")
    mmproj = MmprojFile(tiny.mmproj_path)
    return tiny, VisionEncoder(mmproj), ReferenceModel(GGUFModel(tiny.text_path))


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("height,width", SIZES)
def test_encoder_as_transformers(vl, height, width):
    tiny, encoder, _ = vl
    image = tiny.image(height, width, seed=height)
    patches = preprocess(image, encoder.cfg)
    inputs = hf_image_inputs([IMAGE_PAD] * patches.n_tokens, [image])
    with torch.no_grad():
        ref = tiny.model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output.numpy()
    ours = encoder.encode(patches)
    assert ours.shape == ref.shape == (patches.n_tokens, 64)
    assert _rel(ours, ref) <= ENCODER_REL_TOL


def test_the_position_grid_and_rotary_follow_the_patch_order(vl):
    # the patch order is merge blocks first, as transformers' get_vision_position_ids gives it
    from transformers.vision_utils import get_vision_position_ids
    rows, cols = patch_rows_cols(6, 8, 2)
    theirs = get_vision_position_ids(torch.tensor([[1, 6, 8]]), 2).numpy()
    assert np.array_equal(np.stack([rows, cols], axis=-1), theirs)


def _prompt(vl, seed=0):
    tiny, encoder, _ = vl
    images = [tiny.image(h, w, seed=h) for h, w in SIZES]
    patches = [preprocess(image, encoder.cfg) for image in images]
    ids = prompt_with_images([p.n_tokens for p in patches], seed=seed)
    embeds = [ImageEmbedding(p.token_rows, p.token_cols, encoder.encode(p)) for p in patches]
    return ids, images, embeds


def test_mrope_positions_as_transformers(vl):
    tiny, _, _ = vl
    ids, images, embeds = _prompt(vl)
    inputs = hf_image_inputs(ids, images)
    positions, delta = tiny.model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                       inputs["image_grid_thw"])
    mm = place_images(ids, embeds, IMAGE_PAD, vision_start=VISION_START, vision_end=VISION_END)
    assert np.array_equal(mm.rope_pos, positions[:, 0].numpy())
    assert mm.next_pos - len(ids) == int(delta)
    assert len(mm.rows) == sum(e.rows * e.cols for e in embeds)


def test_logits_and_greedy_tokens_as_transformers(vl):
    tiny, _, reference = vl
    ids, images, embeds = _prompt(vl)
    inputs = hf_image_inputs(ids, images)
    with torch.no_grad():
        out = tiny.model.generate(**inputs, max_new_tokens=GREEDY_STEPS, min_new_tokens=GREEDY_STEPS,
                                  do_sample=False, pad_token_id=0)
    hf_tokens = out[0, len(ids):].tolist()
    mm = place_images(ids, embeds, IMAGE_PAD, vision_start=VISION_START, vision_end=VISION_END)
    state = reference.new_state()
    logits = [reference.prefill(ids, state, all_logits=True, mm=mm)]
    tokens, pos = [], mm.next_pos
    for _ in range(GREEDY_STEPS):
        tokens.append(int(np.argmax(logits[-1][-1])))
        logits.append(reference.forward([tokens[-1]], state, recurrent=True, mm=text_input(pos, 1)))
        pos += 1
    assert tokens == hf_tokens
    ours = np.concatenate(logits)[:-1]
    full = hf_image_inputs(ids + tokens[:-1], images)
    with torch.no_grad():
        ref = tiny.model(**full).logits[0].numpy()
    assert _rel(ours, ref) <= LOGIT_REL_TOL
    # the parity is not vacuous: the images' embeddings and their positions both move the logits
    plain = reference.prefill(ids, reference.new_state(), all_logits=True)
    assert _rel(plain, ref[:len(ids)]) > MATTERS
    flat = place_images(ids, embeds, IMAGE_PAD)
    flat = type(flat)(text_input(0, len(ids)).rope_pos, flat.rows, flat.embeds, len(ids))
    assert _rel(reference.prefill(ids, reference.new_state(), all_logits=True, mm=flat), ref[:len(ids)]) > MATTERS


def test_text_rows_keep_todays_rope_bit_for_bit(vl):
    _, _, reference = vl
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 4, 32)).astype(np.float32)
    positions = np.arange(7, 47)
    same = np.broadcast_to(positions, (3, 40))
    assert np.array_equal(rope_mrope(x, same, 16, 1e4, (3, 3, 2, 0)), rope_neox(x, positions, 16, 1e4))
    ids = rng.integers(0, 280, 30).tolist()
    a = reference.prefill(ids, reference.new_state(), all_logits=True)
    b = reference.prefill(ids, reference.new_state(), all_logits=True, mm=text_input(0, len(ids)))
    assert np.array_equal(a, b)


def test_a_prompt_that_does_not_fit_its_images_is_refused(vl):
    _, _, reference = vl
    ids, _, embeds = _prompt(vl)
    with pytest.raises(ValueError, match="1 images"):
        place_images(ids, embeds[:1], IMAGE_PAD)
    cut = ids[:10] + ids[11:]                       # one image token fewer in the first run
    with pytest.raises(ValueError, match="image 0"):
        place_images(cut, embeds, IMAGE_PAD)
    with pytest.raises(ValueError, match="vision-end"):
        place_images(ids[:-8] + [5] + ids[-7:], embeds, IMAGE_PAD, vision_end=VISION_END)
    mm = place_images(ids, embeds, IMAGE_PAD)
    with pytest.raises(ValueError, match="rows"):
        reference.prefill(ids[:-1], reference.new_state(), mm=mm)


# relative RMS error of the encoder's output against the f32 file's: F16 keeps 11 bits per weight
# (a few 1e-4 through this tower); Q8_0 blocks of 32 keep 8 (about 1%)
MMPROJ_REL_RMS = {"f16": 2e-3, "q8_0": 3e-2}


@pytest.mark.parametrize("out_type", sorted(MMPROJ_REL_RMS))
def test_smaller_mmproj_types_encode_close_to_f32(vl, tmp_path, out_type):
    from common.model.convert.mmproj import convert_mmproj
    tiny, encoder, _ = vl
    small = VisionEncoder(MmprojFile(convert_mmproj(tiny.hf_dir, tmp_path / "m.gguf", out_type, progress=False).path))
    patches = preprocess(tiny.image(200, 120, seed=200), encoder.cfg)
    ref, got = encoder.encode(patches), small.encode(patches)
    assert np.isfinite(got).all() and not np.array_equal(got, ref)
    assert np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)) <= MMPROJ_REL_RMS[out_type]
