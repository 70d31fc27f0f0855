"""The vision tower in the cuda prefill backend, on the CPU: where it runs (backends/cuda_vision.py)
for budgets that hold it beside the text model or do not, and for each `vision` choice; the VRAM it
is counted for against what the encoder allocates; the prefill worker's choice of encoder
(services/prefill/vision.py); and a prompt with an image through the emulated backend
(tests/cuda_emulator.py, the vision kernels as tests/test_cuda_vision_emulated.py states them), its
image rows from the GPU encoder under the backend's own context, against the reference encoder and
the reference model. tests/gpu/test_cuda_vision_prefill.py runs the same on a GPU."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.state import SequenceState
from common.vision.preprocess import preprocess, smart_resize
from common.vision.tensors import MmprojFile
from native.cuda import vision as cuda_vision
from native.cuda.plan import VramBudgetError, gib, make_plan
from services.prefill.backends import cuda as cuda_backend
from services.prefill.backends.cuda_vision import plan_with_vision
from services.prefill.config import PrefillConfig
from services.prefill.vision import ImageRows, load_encoder

from .cuda_emulator import FakeDriver, emulate_cuda
from .vision_helpers import IMAGE_PAD, SIZES_FOR_INTEROP, TinyVL, prompt_with_images, synthetic_image

pytest.importorskip("torch")
pytest.importorskip("transformers")

# the emulated kernels are the reference's numpy statements: other summation orders only
ENCODER_REL_TOL = 2e-5
LOGITS_REL_TOL = 1e-3          # tests/test_cuda_backend_emulated.py's LOGITS_ATOL scale


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    vl = TinyVL(tmp_path_factory.mktemp("vl"))
    return GGUFModel(vl.text_path), vl.mmproj_path


def sizes(model) -> dict[str, int]:
    return {n: t.nbytes for n, t in model.tensors.items()}


def least_text_budget(model, **options) -> int:
    """The smallest budget the text model's plan takes: its fixed part and a minimal expert slot."""
    big = make_plan(model.config, sizes(model), budget=1 << 40, **options)
    return big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes + 8 * big.expert_bytes


def routed(height: int, width: int, cfg) -> np.ndarray:
    """A synthetic image resized to whole image tokens, as the router sends it to prefill."""
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    image = Image.fromarray(synthetic_image(height, width, seed=height))
    return np.asarray(image.resize((w, h), resample=Image.Resampling.BICUBIC))


class Context:
    """A CUDA context stand-in that knows whether it is current."""

    def __init__(self):
        self.depth = 0

    def push(self):
        self.depth += 1

    def pop(self):
        assert self.depth > 0, "popped a context that is not current"
        self.depth -= 1

    def detach(self):
        pass


@pytest.fixture()
def emulated(monkeypatch):
    from .test_cuda_vision_emulated import FakeVisionKernels
    driver, ctx = FakeDriver(1 << 30), Context()
    driver.Device.make_context = lambda self: (ctx.push(), ctx)[1]      # current once made, as pycuda's
    emulate_cuda(monkeypatch, driver)

    class InContext(FakeVisionKernels):
        def gemm(self, *args, **kwargs):
            assert ctx.depth == 1, "a vision kernel launched outside the backend's context"
            super().gemm(*args, **kwargs)
    monkeypatch.setattr(cuda_vision, "VisionKernels", lambda: InContext(driver))
    return driver, ctx


def test_the_tower_takes_its_bytes_off_the_budget_when_it_fits(tiny):
    model, mmproj = tiny
    weights, scratch = cuda_vision.device_bytes(MmprojFile(mmproj))
    n = cuda_vision.max_patches(MmprojFile(mmproj).config)
    assert scratch == cuda_vision.scratch_layout(MmprojFile(mmproj).config, n)[1] > weights > 0
    least = least_text_budget(model, max_context=512)
    budget = least + weights + scratch + (1 << 20)
    for vision in ("auto", "gpu"):
        plan, placed = plan_with_vision(model.config, sizes(model), budget=budget, mmproj=mmproj, vision=vision,
                                        max_context=512)
        assert placed.on_gpu and placed.device_bytes == weights + scratch and placed.max_patches == n
        assert plan.budget == budget - weights - scratch and plan.total_bytes <= plan.budget
        assert gib(weights) in placed.why and gib(scratch) in placed.why
    plan, placed = plan_with_vision(model.config, sizes(model), budget=budget, mmproj=mmproj, vision="cpu",
                                    max_context=512)
    assert not placed.on_gpu and placed.device_bytes == 0 and plan.budget == budget
    plan, placed = plan_with_vision(model.config, sizes(model), budget=budget, mmproj=None, max_context=512)
    assert placed is None and plan.budget == budget
    with pytest.raises(ValueError, match="vision='tpu': choose one of auto, gpu, cpu"):
        plan_with_vision(model.config, sizes(model), budget=budget, mmproj=mmproj, vision="tpu", max_context=512)


def test_a_tower_that_does_not_fit_runs_on_the_cpu_or_is_refused_by_name(tiny):
    model, mmproj = tiny
    weights, scratch = cuda_vision.device_bytes(MmprojFile(mmproj))
    budget = least_text_budget(model, max_context=512) + weights + scratch - (1 << 16)
    plan, placed = plan_with_vision(model.config, sizes(model), budget=budget, mmproj=mmproj, max_context=512)
    assert not placed.on_gpu and plan.budget == budget               # the text model keeps the whole budget
    for text in (gib(weights), gib(scratch), gib(budget), "on the CPU", "raise --vram-budget"):
        assert text in placed.why
    with pytest.raises(VramBudgetError, match=rf"vision='gpu': the vision tower mmproj-f32.gguf needs "
                                              rf"{gib(weights)} of weights and {gib(scratch)} of scratch"):
        plan_with_vision(model.config, sizes(model), budget=budget, mmproj=mmproj, vision="gpu", max_context=512)
    both = least_text_budget(model, max_context=512) + weights + scratch
    assert f"at least {gib(both)} in all" in placed.why
    from services.prefill.backends.cuda_vision import least_text_bytes
    assert least_text_bytes(model.config, sizes(model), max_context=512) + weights + scratch == both
    with pytest.raises(VramBudgetError, match="more than the VRAM budget of"):     # less than the tower alone
        plan_with_vision(model.config, sizes(model), budget=weights // 2, mmproj=mmproj, vision="gpu",
                         max_context=512)


def test_the_encoder_allocates_what_the_budget_counts(tiny, emulated):
    driver, _ = emulated
    file = MmprojFile(tiny[1])
    weights, scratch = cuda_vision.device_bytes(file)
    top = driver.mem.top
    encoder = cuda_vision.CudaVisionEncoder(file, cuda_vision.VisionKernels(), driver, max_patches=64)
    assert encoder.weight_bytes == weights
    assert encoder.nbytes == weights + cuda_vision.scratch_layout(file.config, 64)[1] == driver.mem.top - top
    patches = preprocess(Image.fromarray(routed(200, 120, file.config)), file.config)
    with pytest.raises(ValueError, match=f"an image of {patches.pixels.shape[0]} patches; this encoder was "
                                         "given room for 64"):
        encoder.encode(patches)


def test_the_prefill_worker_takes_the_backends_gpu_encoder(tiny, emulated):
    model, mmproj = tiny
    _, ctx = emulated
    on_gpu = cuda_backend.CUDABackend(model, max_context=512, pass_tokens=64, mmproj=str(mmproj))
    on_cpu = cuda_backend.CUDABackend(model, max_context=512, pass_tokens=64, mmproj=str(mmproj), vision="cpu")
    try:
        assert ctx.depth == 0                                          # made, then popped
        rows = ImageRows(mmproj, backend=on_gpu)
        assert rows.encoder_name == "cuda" and rows.encoder is on_gpu.vision
        assert on_gpu.stats()["vision_device_bytes"] == sum(cuda_vision.device_bytes(MmprojFile(mmproj)))
        assert on_cpu.stats()["vision_device_bytes"] == 0 and on_cpu.vision_encoder(rows.file) is None
        assert ImageRows(mmproj, backend=on_cpu).encoder_name in ("native", "reference")
        assert load_encoder(rows.file, "reference", on_gpu)[0] == "reference"
        with pytest.raises(ValueError, match="no GPU vision encoder"):
            load_encoder(rows.file, "cuda", on_cpu)
        with pytest.raises(ValueError, match="no vision encoder named 'gpu'"):
            load_encoder(rows.file, "gpu", on_gpu)
    finally:
        on_gpu.close()
        on_cpu.close()


def test_an_image_prompt_through_the_emulated_backend_matches_the_reference(tiny, emulated):
    model, mmproj = tiny
    _, ctx = emulated
    backend = cuda_backend.CUDABackend(model, max_context=512, pass_tokens=64, mmproj=str(mmproj))
    try:
        gpu, cpu = ImageRows(mmproj, backend=backend), ImageRows(mmproj, encoder="reference")
        images = [routed(h, w, gpu.cfg) for h, w in SIZES_FOR_INTEROP]
        f = gpu.cfg.factor
        ids = prompt_with_images([(im.shape[0] // f) * (im.shape[1] // f) for im in images])
        done: list = []
        worker = threading.Thread(target=lambda: done.append(gpu.place(ids, images, IMAGE_PAD, 0)))
        worker.start()                                                 # as the server's compute thread
        worker.join()
        got_mm, want_mm = done[0], cpu.place(ids, images, IMAGE_PAD, 0)
        assert ctx.depth == 0
        assert np.array_equal(got_mm.rows, want_mm.rows) and np.array_equal(got_mm.rope_pos, want_mm.rope_pos)
        err = np.abs(got_mm.embeds - want_mm.embeds).max() / np.abs(want_mm.embeds).max()
        assert err <= ENCODER_REL_TOL
        reference = ReferenceModel(model)
        want = reference.prefill(ids, reference.new_state(), all_logits=True, mm=want_mm)
        got = backend.prefill(ids, SequenceState.empty(model.config, backend.kv_type), all_logits=True, mm=got_mm)
        assert np.abs(got - want).max() / np.abs(want).max() <= LOGITS_REL_TOL
        assert np.array_equal(got.argmax(-1), want.argmax(-1))
    finally:
        backend.close()


def test_the_prefill_config_hands_the_mmproj_to_the_cuda_backend_only():
    assert PrefillConfig(model="m", backend="cuda", mmproj="t.gguf").backend_kwargs()["mmproj"] == "t.gguf"
    assert "mmproj" not in PrefillConfig(model="m", backend="cuda").backend_kwargs()
    assert PrefillConfig(model="m", mmproj="t.gguf").backend_kwargs() == {}
