"""The cuda backend on a prompt with images, on a GPU, against the CPU reference: the image rows
over their tokens' embeddings and the mRoPE positions (T, H, W) of every row, in one call and
across two calls that meet after an image; then text after it at pos + rope_delta. Tiny random
model with mRoPE sections; the image rows are random (the encoder is not under test here)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.reference.multimodal import ImageEmbedding, place_images, text_input
from services.prefill.backends.cuda import CUDABackend
from services.prefill.vision import segment

from .test_cuda_parity import LOGITS_REL, PLAIN_TYPES, rel_err
from .tiny_gguf import TinySpec, build

IMAGE, START, END = 500, 501, 502
SECTIONS = (3, 3, 2)            # TinySpec's rope_dim 16: 8 frequencies


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = GGUFModel(build(tmp_path_factory.mktemp("m") / "vl.gguf", TinySpec(types=PLAIN_TYPES)))
    m.__dict__["config"] = dataclasses.replace(m.config, rope_sections=SECTIONS)    # as a VL file's metadata
    assert m.config.rope_sections == SECTIONS
    return m


def prompt(model):
    rng = np.random.default_rng(4)
    H = model.config.hidden_size
    ids, images = [], []
    for rows, cols in ((3, 4), (5, 2)):
        ids += rng.integers(0, 400, 7).tolist() + [START] + [IMAGE] * (rows * cols) + [END]
        images.append(ImageEmbedding(rows, cols, rng.standard_normal((rows * cols, H)).astype(np.float32)))
    ids += rng.integers(0, 400, 9).tolist()
    return ids, place_images(ids, images, IMAGE, vision_start=START, vision_end=END)


@pytest.mark.parametrize("pass_tokens", [256, 16], ids=["one-pass", "passes-through-images"])
def test_images_match_the_reference(model, pass_tokens):
    ids, mm = prompt(model)
    reference = ReferenceModel(model)
    want = reference.prefill(ids, reference.new_state(), all_logits=True, mm=mm)
    backend = CUDABackend(model, pass_tokens=pass_tokens, max_context=512)
    try:
        state = reference.new_state()
        got = backend.prefill(ids, state, all_logits=True, mm=mm)
        assert rel_err(got, want) < LOGITS_REL
        # text after the images, at pos + rope_delta, against the reference's decode
        state.rope_delta = mm.next_pos - len(ids)
        rs = reference.new_state()
        reference.prefill(ids, rs, mm=mm)
        rs.rope_delta = state.rope_delta
        tail = [7, 8, 9]
        assert rel_err(backend.prefill(tail, state), reference.prefill(tail, rs)) < LOGITS_REL
    finally:
        backend.close()


def test_two_calls_meet_after_an_image(model):
    ids, mm = prompt(model)
    cut = int(mm.rows[11]) + 1                       # just after the first image's last row
    reference = ReferenceModel(model)
    want = reference.prefill(ids, reference.new_state(), mm=mm)
    backend = CUDABackend(model, pass_tokens=256, max_context=512)
    try:
        state = reference.new_state()
        backend.prefill(ids[:cut], state, mm=segment(mm, 0, cut))
        head = segment(mm, 0, cut)
        state.rope_delta = head.next_pos - state.pos
        got = backend.prefill(ids[cut:], state, mm=segment(mm, cut, len(ids)))
        assert rel_err(got, want) < LOGITS_REL
        plain = backend.prefill(ids, reference.new_state(), mm=text_input(0, len(ids)))
        assert rel_err(plain, want) > 10 * LOGITS_REL          # the positions and rows do matter
    finally:
        backend.close()
