"""Checkpoints inside the cuda backend's passes, on the emulator (tests/cuda_emulator.py): at each,
the state and logits of a prefill that stopped there; at the end, those of a prefill without
checkpoints; and the weights cross the bus once per pass whatever the checkpoints."""
from __future__ import annotations

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from services.prefill.backends import cuda as cuda_backend

from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import TinySpec, build
from .test_cuda_backend_emulated import LOGITS_ATOL, STATE_ATOL, budget_for


@pytest.fixture(scope="module", params=["qwen35moe", "qwen3next", "qwen35"])
def model(request, tmp_path_factory):
    return GGUFModel(build(tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf", TinySpec(arch=request.param)))


@pytest.fixture()
def emulated(monkeypatch):
    return emulate_cuda(monkeypatch)


def tokens_of(model, n: int, seed: int = 4) -> list[int]:
    return list(np.random.default_rng(seed).integers(0, model.config.vocab_size, n))


def backend_for(model, share: float, pass_tokens: int):
    return cuda_backend.CUDABackend(model, max_context=512, vram_budget=budget_for(model, share, pass_tokens),
                                    pass_tokens=pass_tokens)


def assert_close_states(a, b) -> None:
    assert a.pos == b.pos
    for x, y in zip(a.arrays(), b.arrays()):
        np.testing.assert_allclose(x, y, atol=STATE_ATOL)


# after a 20-token start, 64-token passes begin at 20, 84, 148: 84 and 148 end passes, 86 falls in the
# first K-1 rows of one (its conv tail reaches back before the pass), the others inside DeltaNet chunks
@pytest.mark.parametrize("share,pass_tokens,checkpoints",
                         [(1.0, 256, [84, 148, 192]), (0.0, 64, [30, 84, 86, 100, 148])],
                         ids=["resident-one-pass", "streamed-multipass"])
def test_checkpoints_match_stopped_prefills(model, emulated, share, pass_tokens, checkpoints):
    ids = tokens_of(model, 200)
    backend = backend_for(model, share, pass_tokens)
    ref = ReferenceModel(model)
    start, backend_start = ref.new_state(), ref.new_state()
    ref.prefill(ids[:20], start)
    backend.prefill(ids[:20], backend_start)
    state = backend_start.copy()
    ticks = []
    logits, caught = backend.prefill_with_checkpoints(ids[20:], state, checkpoints, progress=lambda: ticks.append(1))
    assert len(ticks) == -(-180 // pass_tokens)
    assert [c.pos for c in caught] == checkpoints
    for c in caught:
        stopped = backend_start.copy()
        want_logits = backend.prefill(ids[20:c.pos], stopped)
        assert_close_states(c.state(state), stopped)
        np.testing.assert_allclose(c.logits, want_logits, atol=LOGITS_ATOL)
        by_ref = start.copy()
        np.testing.assert_allclose(c.logits, ref.prefill(ids[20:c.pos], by_ref), atol=LOGITS_ATOL)
        assert_close_states(c.state(state), by_ref)
    plain = backend_start.copy()
    np.testing.assert_allclose(logits, backend.prefill(ids[20:], plain), atol=LOGITS_ATOL)
    assert_close_states(state, plain)


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_checkpoints_stream_no_more_weights(model, emulated, share):
    """Four 64-token passes stream the same bytes with checkpoints as without them (a streamed head
    included: the checkpoints' rows go through it with the last one's)."""
    ids = tokens_of(model, 240)
    backend = backend_for(model, share, 64)
    before = backend.stats()
    backend.prefill(ids, ReferenceModel(model).new_state())
    plain = backend.stats()
    backend.prefill_with_checkpoints(ids, ReferenceModel(model).new_state(), [32, 64, 128, 150, 192])
    after = backend.stats()
    assert plain["passes"] - before["passes"] == after["passes"] - plain["passes"] == 4
    per_call = plain["h2d_bytes"] - before["h2d_bytes"]
    assert per_call > 0 and after["h2d_bytes"] - plain["h2d_bytes"] == per_call
