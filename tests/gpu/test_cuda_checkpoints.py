"""Checkpoints inside the cuda backend's passes on a GPU: at each, the state and logits of a
prefill that stopped there and of the reference; at the end, those of a prefill without
checkpoints; the weights cross the bus once per pass whatever the checkpoints."""
from __future__ import annotations

import numpy as np
import pytest

from common.reference.model import ReferenceModel
from services.prefill.backends.cuda import CUDABackend

from .test_cuda_parity import LOGITS_REL, MODELS, STATE_REL, budget, rel_err
from .tiny_gguf import build, open_model


@pytest.fixture(scope="module", params=["qwen35moe-kquants", "qwen3next-low-bit-mix", "qwen35-dense-kquants"])
def model(request, tmp_path_factory):
    return open_model(build(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", MODELS[request.param]))


def assert_close_states(got, want) -> None:
    assert got.pos == want.pos
    for i, (g, w) in enumerate(zip(got.arrays(), want.arrays())):
        assert g.shape == w.shape
        assert rel_err(g, w) < STATE_REL, f"state array {i}"


# after a 20-token start, 64-token passes begin at 20, 84, 148: 84 and 148 end passes, 86 falls in
# the first K-1 rows of one (its conv tail reaches back before the pass)
@pytest.mark.parametrize("share,pass_tokens,checkpoints",
                         [(1.0, 256, [84, 148, 192]), (0.0, 64, [30, 84, 86, 100, 148])],
                         ids=["resident-one-pass", "streamed-multipass"])
def test_checkpoints_match_stopped_prefills(model, share, pass_tokens, checkpoints):
    ids = [int(t) for t in np.random.default_rng(4).integers(0, model.config.vocab_size, 200)]
    ref = ReferenceModel(model)
    backend = CUDABackend(model, vram_budget=budget(model, share, pass_tokens), pass_tokens=pass_tokens,
                          max_context=512)
    try:
        start, backend_start = ref.new_state(), ref.new_state()
        ref.prefill(ids[:20], start)
        backend.prefill(ids[:20], backend_start)
        state = backend_start.copy()
        before = backend.stats()
        logits, caught = backend.prefill_with_checkpoints(ids[20:], state, checkpoints)
        with_marks = backend.stats()
        assert [c.pos for c in caught] == checkpoints
        plain = backend_start.copy()
        plain_logits = backend.prefill(ids[20:], plain)
        after = backend.stats()
        assert with_marks["passes"] - before["passes"] == after["passes"] - with_marks["passes"]
        assert with_marks["h2d_bytes"] - before["h2d_bytes"] == after["h2d_bytes"] - with_marks["h2d_bytes"]
        assert rel_err(logits, plain_logits) < LOGITS_REL
        assert_close_states(state, plain)
        for c in caught:
            by_ref = start.copy()
            want = ref.prefill(ids[20:c.pos], by_ref)
            assert rel_err(c.logits, want) < LOGITS_REL
            assert int(np.argmax(c.logits)) == int(np.argmax(want))
            assert_close_states(c.state(state), by_ref)
    finally:
        backend.close()
