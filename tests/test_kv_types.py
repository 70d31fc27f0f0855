"""The CPU runner with its KV cache in f16 and q8_0 (common.kv_cache) on a tiny synthetic GGUF:
chunked prefill against token-by-token decode in each type, the split decode of a long context
against the prefill's unsplit attention, f16 and q8_0 against f32, and states of another type
refused."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.kv_cache import KV_TYPES, KvTypeError, kv_decode, kv_dtype, kv_shape
from common.model.gguf_file import GGUFModel
from native.cpu_runner import CpuRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# Chunked prefill and decode share the attention kernel, and where the batched matvecs sum a
# row's blocks as the one-row ones do they agree exactly. Where the sums differ (another ISA's
# batched kernels: ~1e-7 relative), a K or V value can cross a rounding boundary: one f16 ulp
# (2^-11) or one q8_0 step (max / 127) moves the logits by up to these shares of the largest.
SAME_KERNEL_REL_TOL = {"f32": 1e-5, "f16": 1e-3, "q8_0": 5e-3}
# The merge of the splits sums each row's weights and values in another order than one pass.
SPLIT_REL_TOL = 1e-5
# f16 keeps 11 significant bits of each K and V value (relative error <= 2^-11); this synthetic net
# amplifies that to a few 1e-3 of the largest logit.
F16_REL_TOL = 1e-2
# q8_0 keeps ~7 bits per value relative to its block's largest.
Q8_REL_TOL = 5e-2
PROMPT = 200


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_synthetic(tmp_path_factory.mktemp("kv") / "q4_0.gguf", layers=4, recipe="q4_0", widths=TINY)
    return GGUFModel(path)


def prompt(n: int, seed: int = 3) -> list[int]:
    return np.random.default_rng(seed).integers(0, TINY.vocab, n).tolist()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_chunked_prefill_equals_token_by_token(model, kv_type):
    eng = CpuRunner(model, threads=2, kv_type=kv_type)
    ids = prompt(PROMPT)
    one, chunked = eng.new_state(), eng.new_state()
    expect = np.stack([eng.decode([t], [one])[0] for t in ids])
    got = eng.prefill(ids, chunked, chunk=64, all_logits=True)
    assert rel(got, expect) <= SAME_KERNEL_REL_TOL[kv_type]
    assert chunked.pos == one.pos == PROMPT and chunked.kv_type == one.kv_type == kv_type
    shape = kv_shape(PROMPT, TINY.kv_heads, TINY.head_dim, kv_type)
    for x, y in zip(chunked.k + chunked.v, one.k + one.v):
        assert x.dtype == y.dtype == kv_dtype(kv_type) and x.shape == y.shape == shape
        a, b = kv_decode(x, kv_type), kv_decode(y, kv_type)
        assert np.abs(a - b).max() <= 2 * SAME_KERNEL_REL_TOL[kv_type] * np.abs(b).max()


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_split_decode_of_a_long_context_matches_prefill(model, kv_type):
    """Past a few hundred keys, with more pool threads than KV heads, a decode step splits each
    sequence's keys across the threads and merges the parts; a one-token prefill from the same
    state attends unsplit."""
    eng = CpuRunner(model, threads=4, kv_type=kv_type)
    ids = prompt(1201, seed=4)
    state = eng.new_state()
    for end in (600, 1200):
        eng.prefill(ids[state.pos:end], state)
        split, whole = state.copy(), state.copy()
        got, expect = eng.decode([ids[end]], [split])[0], eng.prefill([ids[end]], whole)
        assert rel(got, expect) <= SPLIT_REL_TOL


@pytest.mark.parametrize("kv_type, tol", [("f16", F16_REL_TOL), ("q8_0", Q8_REL_TOL)])
def test_logits_stay_close_to_f32(model, kv_type, tol):
    ids = prompt(PROMPT, seed=5)
    runs = {}
    for t in ("f32", kv_type):
        eng = CpuRunner(model, threads=2, kv_type=t)
        state = eng.new_state()
        rows = [eng.prefill(ids, state, chunk=64, all_logits=True)]
        rows += [eng.decode([int(np.argmax(rows[-1][-1]))], [state]) for _ in range(8)]
        runs[t] = np.concatenate(rows)
    assert rel(runs[kv_type], runs["f32"]) <= tol


def test_a_state_of_another_type_is_refused(model):
    f16, f32 = CpuRunner(model, threads=2, kv_type="f16"), CpuRunner(model, threads=2)
    state = f32.new_state()
    f32.prefill(prompt(5), state)
    with pytest.raises(ValueError, match="state KV cache is f32 but this runner keeps f16"):
        f16.decode([1], [state])
    with pytest.raises(ValueError, match="state KV cache is f32 but this runner keeps f16"):
        f16.prefill([1, 2], state)
    assert state.pos == 5 and state.k[0].dtype == np.float32
    with pytest.raises(KvTypeError):
        CpuRunner(model, threads=2, kv_type="q4_0")
