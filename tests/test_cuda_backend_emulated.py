"""The cuda backend's host logic on the CPU: kernels and driver replaced by tests/cuda_emulator.

Runs the real planning, resident upload, expert grouping, pointer tables, slot ring, passes
and state round trip against the reference model, at budgets that pin everything, pin part
of the experts, or stream every expert and the LM head.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from common.kv_cache import kv_decode, kv_dtype
from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.state import SequenceState
from native.cuda.plan import make_plan
from services.prefill.backends import cuda as cuda_backend

from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import MIX_IQ, MIX_LOW, TinySpec, build, open_model

# the emulated kernels are the reference's own numpy ops, so only summation order differs
LOGITS_ATOL = 1e-3
STATE_ATOL = 1e-3
# the device attends over a call's own new rows in f32, the reference over them rounded to the
# cache type: for q8_0 (a step of max|x| / 127 per block of 32) that rounding bounds the gap, for
# f16 a stored row may land one step (2^-9 at |x| < 4) away
KV_ROUNDING_ATOL = {"f32": LOGITS_ATOL, "f16": 4e-3, "q8_0": 2e-2}


@pytest.fixture(scope="module", params=["qwen35moe", "qwen3next"])
def model(request, tmp_path_factory):
    path = build(tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf", TinySpec(arch=request.param))
    return GGUFModel(path)


@pytest.fixture()
def emulated(monkeypatch):
    driver = emulate_cuda(monkeypatch)
    return driver


def budget_for(model, share: float, pass_tokens: int) -> int:
    """A budget that leaves `share` of the experts resident (0: all streamed, head too)."""
    cfg = model.config
    sizes = {n: t.nbytes for n, t in model.tensors.items()}
    big = make_plan(cfg, sizes, budget=1 << 40, pass_tokens=pass_tokens, max_context=512)
    fixed = (big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes)
    experts = big.pinned_bytes
    if share == 0:
        return fixed + 8 * big.expert_bytes + 1024
    return fixed + big.head_bytes + int(share * experts) + cfg.n_experts * big.expert_bytes


_REFERENCE: dict = {}


def reference(model, tokens, split):
    """Logits of both calls and the final state, computed once per model."""
    key = (str(model.path), len(tokens), split)
    if key not in _REFERENCE:
        ref = ReferenceModel(model)
        rs = ref.new_state()
        logits = [ref.prefill(tokens[:split], rs), ref.prefill(tokens[split:], rs)]
        _REFERENCE[key] = (logits, rs)
    return _REFERENCE[key]


def run_both(model, tokens, **options):
    split = len(tokens) * 2 // 3                           # the second call continues from the state
    want, rs = reference(model, tokens, split)
    backend = cuda_backend.CUDABackend(model, max_context=512, **options)
    cs = rs.empty(model.config)
    got = [backend.prefill(tokens[:split], cs), backend.prefill(tokens[split:], cs)]
    return list(zip(want, got)), rs, cs, backend


@pytest.mark.parametrize("share,pass_tokens", [(1.0, 256), (0.5, 256), (0.0, 64)],
                         ids=["resident", "half-pinned", "all-streamed-multipass"])
def test_matches_reference(model, emulated, share, pass_tokens):
    matches_reference(model, share, pass_tokens)


def matches_reference(model, share, pass_tokens):
    tokens = list(np.random.default_rng(1).integers(0, model.config.vocab_size, 90))
    budget = budget_for(model, share, pass_tokens)
    out, rs, cs, backend = run_both(model, tokens, vram_budget=budget, pass_tokens=pass_tokens)
    plan = backend.plan
    if share == 1.0:
        assert plan.pinned_experts == plan.n_experts and plan.head_resident
    elif share == 0.0:
        assert plan.pinned_experts == 0 and not plan.head_resident
    else:
        assert 0 < plan.pinned_experts < plan.n_experts
    for want, got in out:
        np.testing.assert_allclose(got, want, atol=LOGITS_ATOL)
    assert cs.pos == rs.pos == len(tokens)
    for a, b in zip(cs.arrays(), rs.arrays()):
        np.testing.assert_allclose(a, b, atol=STATE_ATOL)
    stats = backend.stats()
    assert stats["peak_device_bytes"] <= budget
    if share < 1.0:
        assert stats["h2d_bytes"] > 0
    else:
        assert stats["h2d_bytes"] == 0


MIXES = {"iq-mix": MIX_IQ, "low-bit-mix": MIX_LOW}     # every type of quant_linear.cuh and quant_iq.cuh


@pytest.fixture(scope="module", params=list(MIXES))
def mixed(request, tmp_path_factory):
    return open_model(build(tmp_path_factory.mktemp("mix") / f"{request.param}.gguf", MIXES[request.param]))


@pytest.mark.parametrize("share,pass_tokens", [(1.0, 256), (0.0, 64)], ids=["resident", "all-streamed-multipass"])
def test_mixed_types_match_reference(mixed, emulated, share, pass_tokens):
    """Files whose tensors mix the newer types by role and by layer: each GEMM is launched with
    its tensor's own type (the emulated kernels refuse a type the real registry lacks)."""
    matches_reference(mixed, share, pass_tokens)


def test_streamed_bytes_follow_each_type(tmp_path, emulated):
    """Two files alike but for their experts' type (Q4_K, 144 bytes per 256 weights; IQ2_XXS, 66):
    the plan's expert size, the streamer's per-expert copies and the bytes that crossed the bus
    with every expert streamed and the head resident all scale by 66 / 144."""
    tokens = list(np.random.default_rng(5).integers(0, 512, 90))
    got = {}
    for qtype in (Q.Q4_K, Q.IQ2_XXS):
        spec = TinySpec(types={**TinySpec().types, "experts": qtype, "down": qtype})
        model = open_model(build(tmp_path / f"{qtype.name}.gguf", spec))
        big = make_plan(model.config, {n: t.nbytes for n, t in model.tensors.items()}, budget=1 << 40,
                        pass_tokens=64, max_context=512)
        budget = (big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes + big.head_bytes
                  + 8 * big.expert_bytes + 1024)
        backend = cuda_backend.CUDABackend(model, max_context=512, vram_budget=budget, pass_tokens=64)
        state = SequenceState.empty(model.config, "f32")
        backend.prefill(tokens, state)
        assert backend.plan.pinned_experts == 0 and backend.plan.head_resident
        got[qtype] = (backend.plan.expert_bytes, set(backend.streamer.ebytes.values()), backend.stats()["h2d_bytes"])
    (e4, eb4, h4), (e2, eb2, h2) = got[Q.Q4_K], got[Q.IQ2_XXS]
    assert e2 * 144 == e4 * 66
    assert {b * 144 for b in eb2} == {b * 66 for b in eb4}
    assert h4 > 0 and h2 * 144 == h4 * 66


def test_budget_too_small_is_explained(model, emulated):
    with pytest.raises(ValueError, match="too small"):
        cuda_backend.CUDABackend(model, vram_budget="1MiB")


def test_pageable_fallback_when_pinning_fails(model, emulated, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise MemoryError("locked-memory limit reached")
    monkeypatch.setattr(emulated, "pagelocked_empty", refuse)
    monkeypatch.setattr(emulated, "register_host_memory", refuse)       # the same limit refuses both
    tokens = list(np.random.default_rng(1).integers(0, model.config.vocab_size, 90))
    budget = budget_for(model, 0.0, 64)
    with caplog.at_level("WARNING", logger="fermium.prefill.cuda"):
        out, rs, cs, backend = run_both(model, tokens, vram_budget=budget, pass_tokens=64)
    assert backend.stats()["pinned_host"] == 0
    assert "pageable" in caplog.text
    for want, got in out:
        np.testing.assert_allclose(got, want, atol=LOGITS_ATOL)


@pytest.mark.parametrize("kv_type,pass_tokens", [("f16", 256), ("q8_0", 256), ("f32", 32), ("f16", 32)])
def test_a_state_in_another_kv_type_goes_up_decoded_and_comes_back_encoded(model, emulated, kv_type, pass_tokens):
    """The reference with that cache type is the yardstick; the device keeps f32, so only the
    rows the reference reads back decoded differ, and they are stored in the type again, pass by
    pass when the prompt takes several."""
    tokens = list(np.random.default_rng(2).integers(0, model.config.vocab_size, 90))
    split = len(tokens) * 2 // 3
    ref = ReferenceModel(model, kv_type=kv_type)
    rs = ref.new_state()
    want = [ref.prefill(tokens[:split], rs), ref.prefill(tokens[split:], rs)]
    backend = cuda_backend.CUDABackend(model, max_context=512, vram_budget=budget_for(model, 1.0, pass_tokens),
                                       pass_tokens=pass_tokens, kv_type=kv_type)
    cs = SequenceState.empty(model.config, kv_type)
    got = [backend.prefill(tokens[:split], cs), backend.prefill(tokens[split:], cs)]
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=KV_ROUNDING_ATOL[kv_type])
    assert cs.kv_type == kv_type and cs.pos == rs.pos
    first = cs.k[0][:split].copy()
    for a, b in zip(cs.k + cs.v, rs.k + rs.v):
        assert a.dtype == b.dtype == kv_dtype(kv_type) and a.shape == b.shape
        np.testing.assert_allclose(kv_decode(a, kv_type), kv_decode(b, kv_type), atol=KV_ROUNDING_ATOL[kv_type])
    backend.prefill(tokens[:4], cs)                           # earlier rows are kept as stored, not re-encoded
    np.testing.assert_array_equal(cs.k[0][:split], first)
    other = "f16" if kv_type == "f32" else "f32"
    with pytest.raises(ValueError, match=f"in '{other}', this backend in"):
        backend.prefill(tokens[:4], SequenceState.empty(model.config, other))
