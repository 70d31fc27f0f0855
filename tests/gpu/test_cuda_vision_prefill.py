"""A prompt with images through the cuda backend on a GPU, the vision tower on that GPU too
(--mmproj, services/prefill/backends/cuda_vision.py), against the CPU path: the prefill worker's
image rows (services/prefill/vision.py ImageRows) from the backend's encoder against the numpy
reference encoder's, and the logits of the whole prompt against the reference model's on the
reference rows. Two images (64x96 and 200x120 before the router's resize), in one pass and in passes
that cut through them; f16 and q8_0 towers. The images are encoded on another thread than the one
that made the backend, as the prefill server's compute loop does. Then the VRAM: the backend stays
within its budget with the tower resident, and a budget that cannot hold the tower beside the text
model leaves it on the CPU. Needs no torch: the text model is tiny_gguf's, the tower
tools/make_synthetic_mmproj.py's at small widths."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from PIL import Image

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.state import SequenceState
from common.vision.preprocess import smart_resize
from common.vision.tensors import MmprojFile
from native.cuda.plan import make_plan
from native.cuda.vision import device_bytes
from services.prefill.backends.cuda import CUDABackend
from services.prefill.vision import ImageRows
from tools.make_synthetic_mmproj import Tower, write_synthetic_mmproj

from .test_cuda_parity import LOGITS_REL, PLAIN_TYPES, rel_err
from .tiny_gguf import TinySpec, build

IMAGE, START, END = 500, 501, 502
SECTIONS = (3, 3, 2)                    # TinySpec's rope_dim 16: 8 frequencies
SIZES = ((64, 96), (200, 120))
# both read the same dequantized weights in fp32 (tests/gpu/test_cuda_vision.py's ENCODER_REL_TOL)
ENCODER_REL_TOL = 2e-5
# a 64-wide FFN of 200 (no whole 32: widened for q8_0), 2 heads of 32, out to TinySpec's 256
TOWER = Tower(blocks=2, hidden=64, ffn=200, heads=2, grid_side=8, out=256)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = GGUFModel(build(tmp_path_factory.mktemp("m") / "vl.gguf", TinySpec(types=PLAIN_TYPES)))
    m.__dict__["config"] = dataclasses.replace(m.config, rope_sections=SECTIONS)    # as a VL file's metadata
    return m


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def mmproj(request, tmp_path_factory):
    return write_synthetic_mmproj(tmp_path_factory.mktemp("v") / f"mmproj-{request.param}.gguf", request.param,
                                  TOWER, seed=3)


def routed(height: int, width: int, cfg, seed: int) -> np.ndarray:
    """A random image resized to whole image tokens, as the router sends it."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return np.asarray(image.resize((w, h), resample=Image.Resampling.BICUBIC))


def prompt(cfg) -> tuple[list[int], list[np.ndarray]]:
    rng = np.random.default_rng(4)
    ids, images = [], []
    for n, (height, width) in enumerate(SIZES):
        pixels = routed(height, width, cfg, seed=n)
        tokens = (pixels.shape[0] // cfg.factor) * (pixels.shape[1] // cfg.factor)
        ids += rng.integers(0, 400, 7).tolist() + [START] + [IMAGE] * tokens + [END]
        images.append(pixels)
    return ids + rng.integers(0, 400, 9).tolist(), images


def on_a_thread(fn):
    out: list = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    assert out, "the encoding thread failed"
    return out[0]


@pytest.mark.parametrize("pass_tokens", [256, 16], ids=["one-pass", "passes-through-images"])
def test_an_image_prompt_on_the_gpu_matches_the_cpu_path(model, mmproj, pass_tokens):
    backend = CUDABackend(model, pass_tokens=pass_tokens, max_context=512, mmproj=str(mmproj))
    try:
        gpu, cpu = ImageRows(mmproj, backend=backend), ImageRows(mmproj, encoder="reference")
        assert gpu.encoder_name == "cuda"
        assert backend.stats()["vision_device_bytes"] == sum(device_bytes(MmprojFile(mmproj)))
        ids, images = prompt(gpu.cfg)
        got_mm = on_a_thread(lambda: gpu.place(ids, images, IMAGE, 0))
        want_mm = cpu.place(ids, images, IMAGE, 0)
        assert np.array_equal(got_mm.rows, want_mm.rows) and np.array_equal(got_mm.rope_pos, want_mm.rope_pos)
        assert np.isfinite(got_mm.embeds).all() and rel_err(got_mm.embeds, want_mm.embeds) <= ENCODER_REL_TOL
        reference = ReferenceModel(model)
        want = reference.prefill(ids, reference.new_state(), all_logits=True, mm=want_mm)
        got = backend.prefill(ids, SequenceState.empty(model.config, backend.kv_type), all_logits=True, mm=got_mm)
        assert rel_err(got, want) < LOGITS_REL
        assert int(np.argmax(got[-1])) == int(np.argmax(want[-1]))
    finally:
        backend.close()


def test_the_tower_in_the_vram_budget(model, mmproj):
    weights, scratch = device_bytes(MmprojFile(mmproj))
    big = make_plan(model.config, {n: t.nbytes for n, t in model.tensors.items()}, budget=1 << 40,
                    pass_tokens=256, max_context=512)
    least = big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes + 8 * big.expert_bytes
    budget = least + weights + scratch + (64 << 20)
    backend = CUDABackend(model, pass_tokens=256, max_context=512, mmproj=str(mmproj), vram_budget=budget)
    try:
        assert backend.vision is not None and backend.plan.budget == budget - weights - scratch
        assert backend.device_used_at_start <= budget        # measured by the driver, the tower included
    finally:
        backend.close()
    short = least + weights + scratch - (1 << 16)
    backend = CUDABackend(model, pass_tokens=256, max_context=512, mmproj=str(mmproj), vram_budget=short)
    try:
        assert backend.vision is None and backend.stats()["vision_device_bytes"] == 0
        assert ImageRows(mmproj, backend=backend).encoder_name in ("native", "reference")
    finally:
        backend.close()
