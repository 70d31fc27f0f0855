"""Checkpoints taken inside one prefill pass (common.state.Checkpoint): at each, the state and
logits of a prefill that stopped there, and at the end those of a prefill without checkpoints;
on the native CPU runner bit for bit, with no weight pass of their own."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native.cpu_runner import CpuRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# the reference's projections run over the whole call's rows at once, a prefill that stops over
# fewer: BLAS may sum them in another order
REF_TOL = 1e-5


def prompt(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, TINY.vocab, n).tolist()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"moe": write_synthetic(root / "moe.gguf", layers=4, recipe="q4_k_m", widths=TINY),
            "next": write_synthetic(root / "next.gguf", layers=4, recipe="f32", widths=TINY, arch="qwen3next"),
            "dense": write_synthetic(root / "dense.gguf", layers=4, recipe="q4_0", widths=TINY, arch="qwen35")}


def stopped_at(runner, ids: list[int], start, cut: int, **kw):
    """(state, last logits) of a prefill of ids[:cut] from a copy of `start`."""
    state = start.copy()
    logits = runner.prefill(ids[:cut], state, **kw)
    return state, logits


def close(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.abs(a - b).max() <= tol * max(np.abs(b).max(), 1.0)


def check_checkpoints(runner, ids, checkpoints, tol: float, **kw) -> None:
    """Each checkpoint against a prefill stopping there; the end against one without checkpoints.
    tol 0: bit for bit."""
    same = np.array_equal if tol == 0 else (lambda a, b: close(a, b, tol))
    start = runner.new_state()
    state = start.copy()
    logits, caught = runner.prefill_with_checkpoints(ids, state, checkpoints, **kw)
    assert [c.pos for c in caught] == list(checkpoints)
    for c in caught:
        want, want_logits = stopped_at(runner, ids, start, c.pos, **kw)
        got = c.state(state)
        assert got.pos == want.pos
        assert all(same(a, b) for a, b in zip(got.arrays(), want.arrays()))
        assert same(c.logits, want_logits)
    plain, plain_logits = stopped_at(runner, ids, start, len(ids), **kw)
    assert state.pos == plain.pos and same(logits, plain_logits)
    assert all(same(a, b) for a, b in zip(state.arrays(), plain.arrays()))


@pytest.mark.parametrize("name", ["moe", "next", "dense"])
def test_native_checkpoints_are_bit_identical(files, name):
    runner = CpuRunner(GGUFModel(files[name]), threads=2)
    check_checkpoints(runner, prompt(300), [64, 128, 256], 0, chunk=64)


def test_native_checkpoints_between_chunks(files):
    """A checkpoint off the chunk grid cuts a chunk there: its state is still a stopped prefill's,
    bit for bit; the end differs from the uncut prefill's only in the batching of the matvecs."""
    runner = CpuRunner(GGUFModel(files["next"]), threads=2)
    ids, start = prompt(200), runner.new_state()
    state = start.copy()
    logits, caught = runner.prefill_with_checkpoints(ids, state, [10, 100, 101], chunk=64)
    for c in caught:
        want, want_logits = stopped_at(runner, ids, start, c.pos, chunk=64)
        assert all(np.array_equal(a, b) for a, b in zip(c.state(state).arrays(), want.arrays()))
        assert np.array_equal(c.logits, want_logits)
    plain, plain_logits = stopped_at(runner, ids, start, len(ids), chunk=64)
    assert close(logits, plain_logits, 1e-5)
    assert all(close(a, b, 1e-5) for a, b in zip(state.arrays(), plain.arrays()))


def test_native_checkpoints_on_the_chunk_grid_read_no_more_weights(files):
    """Checkpoints at multiples of the chunk: as many chunks (weight passes) as without them, and
    the same weight bytes but one LM-head read per checkpoint (its logits row)."""
    model = GGUFModel(files["moe"])
    runner = CpuRunner(model, threads=2)
    ids = prompt(300)
    runner.prefill(ids, runner.new_state(), chunk=64)
    chunks, plain_bytes = runner.last_chunks, runner.last_bytes
    runner.prefill_with_checkpoints(ids, runner.new_state(), [64, 128, 192, 256], chunk=64)
    assert runner.last_chunks == chunks == 5
    assert runner.last_bytes - plain_bytes == 4 * model.tensors["output.weight"].nbytes


def test_native_progress_per_chunk(files):
    runner = CpuRunner(GGUFModel(files["dense"]), threads=2)
    ticks = []
    runner.prefill_with_checkpoints(prompt(150), runner.new_state(), [100], chunk=64, progress=lambda: ticks.append(1))
    assert len(ticks) == 4                  # [0, 64) [64, 100) [100, 128) [128, 150)


def test_reference_checkpoints(files):
    check_checkpoints(ReferenceModel(GGUFModel(files["next"])), prompt(200), [64, 128], REF_TOL)


def test_reference_checkpoints_off_the_chunk_grid(files):
    """The DeltaNet chunks restart at a checkpoint, as in a prefill that stopped there."""
    ref = ReferenceModel(GGUFModel(files["moe"]))
    ids, start = prompt(150), ref.new_state()
    state = start.copy()
    _, caught = ref.prefill_with_checkpoints(ids, state, [30, 97], progress=lambda: None)
    for c in caught:
        want, want_logits = stopped_at(ref, ids, start, c.pos)
        assert all(close(a, b, REF_TOL) for a, b in zip(c.state(state).arrays(), want.arrays()))
        assert close(c.logits, want_logits, REF_TOL)


@pytest.mark.parametrize("bad", [[0], [150], [64, 64], [100, 64], [-3]])
def test_checkpoints_outside_the_call_are_refused(files, bad):
    runner = CpuRunner(GGUFModel(files["dense"]), threads=2)
    state = runner.new_state()
    with pytest.raises(ValueError, match="checkpoints"):
        runner.prefill_with_checkpoints(prompt(150), state, bad)
    assert state.pos == 0
