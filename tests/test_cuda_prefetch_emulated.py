"""The next layer's experts go up ahead of its routing when nearly all will be routed, on the CPU
emulator: long prompts stream every expert of every layer and still match the reference; short
ones stream only what they routed."""
from __future__ import annotations

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native.cuda.experts import PREFETCH_UNROUTED
from services.prefill.backends import cuda as cuda_backend

from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import TinySpec, build
from .test_cuda_backend_emulated import LOGITS_ATOL, budget_for


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return GGUFModel(build(tmp_path_factory.mktemp("tiny") / "qwen35moe.gguf", TinySpec()))


def streamed_bytes(backend) -> int:
    """Bytes of every streamed expert of every layer: one pass's copies when all are prefetched."""
    st, P, E = backend.streamer, backend.plan.pinned_experts, backend.cfg.n_experts
    return sum(st.expert_bytes(i) for i in range(backend.cfg.n_layers)) * (E - P)


@pytest.mark.parametrize("T", [3, 40])
def test_prefetch_streams_every_expert_only_when_nearly_all_are_routed(model, monkeypatch, T):
    emulate_cuda(monkeypatch)
    cfg = model.config
    tokens = list(np.random.default_rng(T).integers(0, cfg.vocab_size, T))
    backend = cuda_backend.CUDABackend(model, vram_budget=budget_for(model, 0.5, 64), pass_tokens=64,
                                       max_context=512)
    try:
        ref = ReferenceModel(model)
        state = ref.new_state()
        np.testing.assert_allclose(backend.prefill(tokens, state.empty(cfg)), ref.prefill(tokens, state),
                                   atol=LOGITS_ATOL)
        assert backend.plan.head_resident
        copied = backend.stats()["h2d_bytes"]
        prefetches = (1 - cfg.n_experts_used / cfg.n_experts) ** T <= PREFETCH_UNROUTED
        assert prefetches == (T == 40)
        if prefetches:
            assert copied == streamed_bytes(backend)
        else:
            assert 0 < copied < streamed_bytes(backend)
    finally:
        backend.close()


def test_two_attention_layers_in_passes_share_the_read_back_scratch(tmp_path, monkeypatch):
    """Eight layers (attention at 3 and 7) in passes of 16: each attention layer's rows are read
    back into the one scratch and encoded from it later, while the next layer computes."""
    emulate_cuda(monkeypatch)
    model = GGUFModel(build(tmp_path / "eight.gguf", TinySpec(layers=8)))
    cfg = model.config
    assert len(cfg.full_layers) == 2
    tokens = list(np.random.default_rng(8).integers(0, cfg.vocab_size, 53))
    ref = ReferenceModel(model, kv_type="f32")
    want_state = ref.new_state()
    want = ref.prefill(tokens, want_state)
    backend = cuda_backend.CUDABackend(model, pass_tokens=16, max_context=128, kv_type="f32")
    try:
        state = want_state.empty(cfg, "f32")
        np.testing.assert_allclose(backend.prefill(tokens, state), want, atol=LOGITS_ATOL)
        for got, ref_rows in zip(state.k + state.v, want_state.k + want_state.v):
            np.testing.assert_allclose(got, ref_rows, atol=LOGITS_ATOL)
    finally:
        backend.close()
