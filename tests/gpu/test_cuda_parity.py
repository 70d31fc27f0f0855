"""The cuda backend against the CPU reference on tiny random models, on a GPU: first-token
logits, every array of the final state, and greedy decoding from the handed-over state."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native.cuda.plan import make_plan
from services.prefill.backends.cuda import CUDABackend

from .tiny_gguf import MIX_IQ, MIX_LOW, TinySpec, build, open_model

# fp32 sums in another order through 4 random layers; the scan inverts in fp32 where the
# reference solves in float64. Errors are relative to the largest magnitude of the array.
LOGITS_REL = 2e-3
STATE_REL = 2e-3
GREEDY_STEPS = 8

PLAIN_TYPES = {"experts": Q.Q8_0, "down": Q.Q4_0, "attn": Q.F16, "linear": Q.BF16, "shared": Q.F32,
               "router": Q.F16, "embd": Q.Q8_0, "head": Q.F32, "small": Q.F32}
MODELS = {"qwen35moe-kquants": TinySpec(), "qwen3next-kquants": TinySpec(arch="qwen3next"),
          "qwen35moe-plain": TinySpec(types=PLAIN_TYPES),
          "qwen35moe-iq-mix": MIX_IQ, "qwen3next-low-bit-mix": MIX_LOW}    # every newer type, mixed by layer


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-6))


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    return open_model(build(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", MODELS[request.param]))


_REF: dict = {}


def reference(model, tokens, split):
    key = (str(model.path), split)
    if key not in _REF:
        eng = ReferenceModel(model)
        st = eng.new_state()
        first = eng.prefill(tokens[:split], st)
        second = eng.prefill(tokens[split:], st)
        _REF[key] = (eng, [first, second], st)
    return _REF[key]


def budget(model, share: float, pass_tokens: int) -> int:
    sizes = {n: t.nbytes for n, t in model.tensors.items()}
    big = make_plan(model.config, sizes, budget=1 << 40, pass_tokens=pass_tokens, max_context=512)
    fixed = big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes
    if share == 0:
        return fixed + 8 * big.expert_bytes + 1024
    return fixed + big.head_bytes + int(share * big.pinned_bytes) + model.config.n_experts * big.expert_bytes


@pytest.mark.parametrize("share,pass_tokens", [(1.0, 256), (0.5, 256), (0.0, 64)],
                         ids=["resident", "half-pinned", "streamed-multipass"])
def test_prefill_matches_reference(model, share, pass_tokens):
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, model.config.vocab_size, 150)]
    split = 100
    eng, want, ref_state = reference(model, tokens, split)
    b = budget(model, share, pass_tokens)
    backend = CUDABackend(model, vram_budget=b, pass_tokens=pass_tokens, max_context=512)
    try:
        state = eng.new_state()
        got = [backend.prefill(tokens[:split], state), backend.prefill(tokens[split:], state)]
        for g, w in zip(got, want):
            assert rel_err(g, w) < LOGITS_REL
            assert int(np.argmax(g)) == int(np.argmax(w))
        assert state.pos == ref_state.pos
        for i, (g, w) in enumerate(zip(state.arrays(), ref_state.arrays())):
            assert g.shape == w.shape
            assert rel_err(g, w) < STATE_REL, f"state array {i}"
        stats = backend.stats()
        assert stats["peak_device_bytes"] <= b
        assert (stats["h2d_bytes"] > 0) == (share < 1.0)

        # decode greedily from both states: the handed-over state must give the same text
        ours, theirs = state.copy(), ref_state.copy()
        a = b_ = int(np.argmax(want[1]))
        for _ in range(GREEDY_STEPS):
            a = int(np.argmax(eng.decode([a], [ours])[0]))
            b_ = int(np.argmax(eng.decode([b_], [theirs])[0]))
            assert a == b_
    finally:
        backend.close()


def test_all_logits(model):
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, model.config.vocab_size, 70)]
    eng = ReferenceModel(model)
    want = eng.prefill(tokens, eng.new_state(), all_logits=True)
    backend = CUDABackend(model, vram_budget="1GiB", pass_tokens=128, max_context=256)
    try:
        got = backend.prefill(tokens, eng.new_state(), all_logits=True)
    finally:
        backend.close()
    assert got.shape == want.shape
    assert rel_err(got, want) < LOGITS_REL


DEMO_MODELS = sorted((Path(__file__).resolve().parents[2] / "models").glob("shakespeare-demo-*.gguf"))
DEMO_GREEDY = 24


@pytest.mark.skipif(not DEMO_MODELS, reason="no bundled demo model under models/")
@pytest.mark.parametrize("path", DEMO_MODELS, ids=lambda p: p.stem)
def test_demo_model_greedy(path):
    """The bundled demo model: same first-token logits, state and greedy continuation."""
    m = GGUFModel(path)
    eng = ReferenceModel(m)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, m.config.vocab_size, 200)]
    ref_state = eng.new_state()
    want = eng.prefill(tokens, ref_state)
    backend = CUDABackend(m, vram_budget="1GiB", pass_tokens=256, max_context=512)
    try:
        state = eng.new_state()
        got = backend.prefill(tokens, state)
    finally:
        backend.close()
    assert rel_err(got, want) < LOGITS_REL
    for g, w in zip(state.arrays(), ref_state.arrays()):
        assert rel_err(g, w) < STATE_REL
    a = b = int(np.argmax(want))
    seq_a, seq_b = [], []
    for _ in range(DEMO_GREEDY):
        a = int(np.argmax(eng.decode([a], [state])[0]))
        b = int(np.argmax(eng.decode([b], [ref_state])[0]))
        seq_a.append(a)
        seq_b.append(b)
    assert seq_a == seq_b


# the device attends over a call's own rows in f32, the reference over them rounded to the type
KV_TYPE_LOGITS_REL = {"f16": LOGITS_REL, "q8_0": 2e-2}


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_a_state_in_another_kv_type_round_trips(model, kv_type):
    """A state with KV in f16 or q8_0 goes up decoded and comes back in its type, so decode
    can continue from it."""
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, model.config.vocab_size, 150)]
    eng = ReferenceModel(model, kv_type=kv_type)
    ref_state = eng.new_state()
    want = [eng.prefill(tokens[:100], ref_state), eng.prefill(tokens[100:], ref_state)]
    backend = CUDABackend(model, vram_budget="1GiB", pass_tokens=256, max_context=512, kv_type=kv_type)
    try:
        state = eng.new_state()
        got = [backend.prefill(tokens[:100], state), backend.prefill(tokens[100:], state)]
    finally:
        backend.close()
    for g, w in zip(got, want):
        assert rel_err(g, w) < KV_TYPE_LOGITS_REL[kv_type]
    assert state.kv_type == kv_type and state.pos == ref_state.pos
    for g, w in zip(state.k + state.v, ref_state.k + ref_state.v):
        assert g.dtype == w.dtype and g.shape == w.shape
    eng.decode([int(np.argmax(got[1]))], [state])             # the runner of that type takes it
    assert state.pos == ref_state.pos + 1
