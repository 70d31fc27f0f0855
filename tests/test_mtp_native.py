"""The CPU runner's speculative decoding (native/cpu_speculative.py): the batched verify with its
rollback slots against decoding the same tokens one at a time, keep(), and the MTP draft step
against the numpy reference, on every ISA this CPU runs and every KV cache type."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.kv_cache import KV_TYPES, kv_decode
from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native import cpu_lib
from native.cpu_runner import CpuRunner
from tests import kernel_calls

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# the tolerances of tests/test_cpu_runner.py: native against native (batched kernels sum in another
# order), native against the reference on float weights, and on quantized ones
BATCH_REL_TOL = 1e-5
FLOAT_REL_TOL = 1e-4
QUANT_MEDIAN_REL_TOL = 0.015
QUANT_MAX_REL_TOL = 0.1
ISAS = cpu_lib.supported_isas()
DEMO = sorted((Path(__file__).resolve().parents[1] / "models").glob("shakespeare-demo-*.gguf"))
CONTEXTS = (5, 11, 0, 3)              # the sequences' positions before the verify
RUNS = ([1, 2, 3, 4], [4, 1, 3, 2])   # rows per sequence, mixed in one batch


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    out = {r: write_synthetic(root / f"{r}.gguf", layers=4, recipe=r, widths=TINY, mtp=True)
           for r in ("f32", "q4_k_m", "q8_0")}
    for r in ("f32", "q4_k_m"):        # the dense sibling: its MTP block's FFN is dense too
        out[f"dense-{r}"] = write_synthetic(root / f"dense-{r}.gguf", layers=4, recipe=r, widths=TINY, mtp=True,
                                            arch="qwen35")
    return out


def ids(n: int, seed: int, vocab: int = TINY.vocab) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1.0))


def assert_arrays_close(got: list[np.ndarray], want: list[np.ndarray], tol: float = BATCH_REL_TOL) -> None:
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x.shape == y.shape and max_rel(x.astype(np.float32), y.astype(np.float32)) <= tol


def prefilled(runner, seed: int = 0):
    states = [runner.new_state() for _ in CONTEXTS]
    for b, (s, n) in enumerate(zip(states, CONTEXTS)):
        if n:
            runner.prefill(ids(n, seed + b, runner.cfg.vocab_size), s)
    return states


def sequential(runner, tokens, states):
    """decode() one token at a time on copies: each row's logits and the state after each row."""
    logits, after = [], []
    for seq, s in zip(tokens, states):
        s = s.copy()
        after.append([])
        for t in seq:
            logits.append(runner.decode([t], [s])[0])
            after[-1].append(s.copy())
    return np.stack(logits), after


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("runs", RUNS)
def test_verify_equals_sequential_decode(files, isa, kv_type, runs):
    with kernel_calls.isa_restored():
        eng = CpuRunner(GGUFModel(files["q4_k_m"]), threads=2, isa=isa, kv_type=kv_type)
        states = prefilled(eng)
        tokens = [ids(n, 100 + b) for b, n in enumerate(runs)]
        expect, after = sequential(eng, tokens, states)
        rollbacks = [eng.new_rollback(3) if n > 1 else None for n in runs]
        logits, hidden = eng.verify(tokens, states, rollbacks)
    assert logits.shape == (sum(runs), TINY.vocab) and hidden.shape == (sum(runs), TINY.hidden)
    assert max_rel(logits, expect) <= BATCH_REL_TOL
    for b, n in enumerate(runs):
        assert states[b].pos == CONTEXTS[b] + n
        assert_arrays_close(states[b].arrays(), after[b][-1].arrays())
        for j in range(n - 1):   # slot j: the recurrent state after row j
            assert_arrays_close(rollbacks[b].conv[j] + rollbacks[b].ssm[j], after[b][j].conv + after[b][j].ssm)


# (threads, contexts): a verify's runs split their keys across the threads (attn_runs.c) past 512
# keys when runs * KV heads leave threads idle; at 1278 + 4 keys and 8 threads the last of 5 splits
# holds keys 1280 and 1281 only, which the run's first two rows do not see
LONG_CASES = [(2, (700,)), (2, (700, 40)), (8, (1278,)), (8, (600, 1278, 3))]


@pytest.mark.parametrize("threads, contexts", LONG_CASES)
def test_verify_at_a_long_context_equals_sequential_decode(files, threads, contexts):
    eng = CpuRunner(GGUFModel(files["q4_k_m"]), threads=threads, kv_type="f16")
    states = [eng.new_state() for _ in contexts]
    for b, (s, n) in enumerate(zip(states, contexts)):
        eng.prefill(ids(n, b), s)
    tokens = [ids(4 - b % 3, 10 + b) for b in range(len(contexts))]
    expect, after = sequential(eng, tokens, states)
    logits, _ = eng.verify(tokens, states, [eng.new_rollback(3) for _ in contexts])
    assert max_rel(logits, expect) <= BATCH_REL_TOL
    for s, a in zip(states, after):
        assert_arrays_close(s.arrays(), a[-1].arrays())


@pytest.mark.parametrize("name", ["f32", "q4_k_m", "dense-f32", "dense-q4_k_m"])
def test_verify_matches_reference_logits_and_hidden(files, name):
    model = GGUFModel(files[name])
    ref, eng = ReferenceModel(model), CpuRunner(model, threads=2)
    tokens = [ids(n, 200 + b) for b, n in enumerate(RUNS[0])]
    got_states, ref_states = prefilled(eng), prefilled(ref)
    got = eng.verify(tokens, got_states, [eng.new_rollback(3) for _ in tokens])
    want = ref.verify(tokens, ref_states, [ref.new_rollback(3) for _ in tokens])
    for g, w in zip(got, want):   # logits, then the hidden after output_norm
        err = np.abs(g - w).max(axis=-1) / np.abs(w).max()
        if name.endswith("f32"):
            assert err.max() <= FLOAT_REL_TOL
        else:
            assert np.median(err) <= QUANT_MEDIAN_REL_TOL and err.max() <= QUANT_MAX_REL_TOL


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_keep_gives_the_sequential_state_and_decodes_on(files, kv_type):
    eng = CpuRunner(GGUFModel(files["q4_k_m"]), threads=2, kv_type=kv_type)
    tokens = [ids(4, 300 + b) for b in range(len(CONTEXTS))]
    states = prefilled(eng)
    _, after = sequential(eng, tokens, states)
    rollbacks = [eng.new_rollback(3) for _ in tokens]
    eng.verify(tokens, states, rollbacks)
    for b, rows in enumerate((1, 2, 3, 4)):   # keep 1..4 of the 4 rows
        eng.keep(states[b], rollbacks[b], rows, 4)
        assert states[b].pos == CONTEXTS[b] + rows
        assert_arrays_close(states[b].arrays(), after[b][rows - 1].arrays())
    nxt = [7, 8, 9, 10]   # the kept states decode on as the sequential ones do, rows past them overwritten
    got = eng.verify([[t] for t in nxt], states, [None] * len(nxt))[0]
    want = np.stack([eng.decode([t], [after[b][rows - 1]])[0] for b, (t, rows) in enumerate(zip(nxt, (1, 2, 3, 4)))])
    assert max_rel(got, want) <= BATCH_REL_TOL


def test_verify_and_keep_refuse_missing_slots(files):
    eng = CpuRunner(GGUFModel(files["q4_k_m"]), threads=2)
    s = eng.new_state()
    with pytest.raises(ValueError, match="rollback slots"):
        eng.verify([[1, 2, 3]], [s], [eng.new_rollback(1)])
    with pytest.raises(ValueError, match="rollback slots"):
        eng.verify([[1, 2]], [s], [None])
    assert s.pos == 0
    eng.verify([[1, 2]], [s], [eng.new_rollback(1)])
    with pytest.raises(ValueError, match="rows must be"):
        eng.keep(s, eng.new_rollback(1), 3, 2)
    with pytest.raises(ValueError, match="rollback slot"):
        eng.keep(s, None, 1, 2)


def test_rollback_and_draft_state_bytes(files):
    eng = CpuRunner(GGUFModel(files["f32"]), threads=2, kv_type="f16")
    assert eng.has_mtp
    for k in (1, 2, 3):
        assert eng.rollback_bytes(k) == eng.new_rollback(k).nbytes
    d = eng.new_draft_state()
    eng.draft([ids(5, 1)], np.zeros((5, TINY.hidden), np.float32), [d])
    assert eng.draft_state_bytes(5) == d.k[:5].nbytes + d.v[:5].nbytes


def draft_against_reference(eng, ref, seed: int = 0):
    """Three draft steps of two sequences (one of them with no rows in the second), the last over
    a draft vocabulary: [(native, reference) (logits, hidden_out)], and the draft states."""
    rng = np.random.default_rng(seed)
    V, H = eng.cfg.vocab_size, eng.cfg.hidden_size
    dn, dr = [eng.new_draft_state() for _ in range(2)], [ref.new_draft_state() for _ in range(2)]
    vocab = np.sort(rng.choice(V, 37, replace=False))
    out = []
    for step, tokens in enumerate(([ids(2, 1, V), ids(3, 2, V)], [[4], []], [[5], [6]])):
        if step == 2:
            eng.set_draft_vocab(vocab)
            ref.set_draft_vocab(vocab)
        hidden = rng.standard_normal((sum(map(len, tokens)), H)).astype(np.float32)
        out.append((eng.draft(tokens, hidden, dn), ref.draft(tokens, hidden, dr)))
    return out, dn, dr


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("name", ["f32", "dense-f32"])
def test_draft_matches_reference(files, isa, kv_type, name):
    model = GGUFModel(files[name])
    with kernel_calls.isa_restored():
        eng = CpuRunner(model, threads=2, isa=isa, kv_type=kv_type)
        steps, dn, dr = draft_against_reference(eng, ReferenceModel(model, kv_type=kv_type))
    for (got_logits, got_h), (want_logits, want_h) in steps:
        assert got_logits.shape == want_logits.shape and got_h.shape == want_h.shape
        assert max_rel(got_logits, want_logits) <= FLOAT_REL_TOL
        assert max_rel(got_h, want_h) <= FLOAT_REL_TOL
    assert steps[-1][0][0].shape == (2, 37)
    for n, r in zip(dn, dr):
        assert n.pos == r.pos
        for a, b in ((n.k, r.k), (n.v, r.v)):
            assert max_rel(kv_decode(a[:n.pos], kv_type), kv_decode(b[:r.pos], kv_type)) <= FLOAT_REL_TOL


@pytest.mark.parametrize("name", ["q8_0", "q4_k_m", "dense-q4_k_m"])
def test_quantized_draft_tracks_reference(files, name):
    model = GGUFModel(files[name])
    steps, _, _ = draft_against_reference(CpuRunner(model, threads=2), ReferenceModel(model))
    for (got_logits, got_h), (want_logits, want_h) in steps:
        err = np.abs(got_logits - want_logits).max(axis=-1) / np.abs(want_logits).max()
        assert np.median(err) <= QUANT_MEDIAN_REL_TOL and err.max() <= QUANT_MAX_REL_TOL


def test_draft_vocab_columns_are_the_full_vocab_columns(files):
    eng = CpuRunner(GGUFModel(files["q4_k_m"]), threads=2)
    hidden = np.random.default_rng(3).standard_normal((3, TINY.hidden)).astype(np.float32)
    vocab = np.array([0, 17, 255, 256, TINY.vocab - 1])
    full = eng.draft([[1, 2, 3]], hidden, [eng.new_draft_state()])
    eng.set_draft_vocab(vocab)
    part = eng.draft([[1, 2, 3]], hidden, [eng.new_draft_state()])
    assert max_rel(part[0], full[0][:, vocab]) <= BATCH_REL_TOL and max_rel(part[1], full[1]) <= BATCH_REL_TOL
    eng.set_draft_vocab(None)
    assert eng.draft([[1, 2, 3]], hidden, [eng.new_draft_state()])[0].shape == full[0].shape
    with pytest.raises(ValueError, match="sorted"):
        eng.set_draft_vocab(np.array([5, 3]))


def test_a_file_without_mtp_verifies_but_cannot_draft(tmp_path):
    plain = write_synthetic(tmp_path / "plain.gguf", layers=4, recipe="q4_0", widths=TINY)
    eng = CpuRunner(GGUFModel(plain), threads=2)
    assert not eng.has_mtp
    s = eng.new_state()
    expect, _ = sequential(eng, [[1, 2]], [s])
    assert max_rel(eng.verify([[1, 2]], [s], [eng.new_rollback(1)])[0], expect) <= BATCH_REL_TOL
    with pytest.raises(ValueError, match="no MTP block"):
        eng.new_draft_state()


@pytest.mark.parametrize("path", DEMO, ids=[p.name for p in DEMO])
def test_demo_model_draft_matches_reference(path):
    model = GGUFModel(path)
    eng = CpuRunner(model, threads=2)
    if not eng.has_mtp:
        pytest.skip(f"{path.name} has no MTP block")
    steps, _, _ = draft_against_reference(eng, ReferenceModel(model))
    for (got_logits, got_h), (want_logits, want_h) in steps:
        err = np.abs(got_logits - want_logits).max(axis=-1) / np.abs(want_logits).max()
        assert np.median(err) <= QUANT_MEDIAN_REL_TOL and err.max() <= QUANT_MAX_REL_TOL


@pytest.mark.parametrize("isa", ISAS)
def test_draft_of_last_rows_only_is_the_full_drafts_last_rows(files, isa):
    """last_only skips the MoE and the head for every row but each sequence's last; those rows
    still fill the KV, so the KV and the last rows' outputs are the full step's."""
    model = GGUFModel(files["f32"])
    rng = np.random.default_rng(7)
    with kernel_calls.isa_restored():
        eng = CpuRunner(model, threads=2, isa=isa)
        V, H = eng.cfg.vocab_size, eng.cfg.hidden_size
        tokens = [ids(3, 1, V), [], ids(2, 2, V)]
        hidden = rng.standard_normal((5, H)).astype(np.float32)
        full_states, last_states = ([eng.new_draft_state() for _ in tokens] for _ in range(2))
        full = eng.draft(tokens, hidden, full_states)
        last = eng.draft(tokens, hidden, last_states, last_only=True)
        ref = ReferenceModel(model).draft(tokens, hidden, [ReferenceModel(model).new_draft_state() for _ in tokens],
                                          last_only=True)
    for got, want, r in zip(last, full, ref):
        assert got.shape == (2, want.shape[1])
        np.testing.assert_array_equal(got, want[[2, 4]])
        assert max_rel(got, r) <= FLOAT_REL_TOL
    for a, b in zip(full_states, last_states):
        assert a.pos == b.pos
        np.testing.assert_array_equal(a.k[:a.pos], b.k[:b.pos])
        np.testing.assert_array_equal(a.v[:a.pos], b.v[:b.pos])
