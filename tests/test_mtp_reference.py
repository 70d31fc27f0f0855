"""The reference model's speculative-decoding methods (issue #31): verify is decode row by row with
the recurrent state saved after each row, keep rolls back to a sequential run's state, and draft is
the MTP block of CONTRACT.md, held against a direct numpy computation from the file's tensors."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.state import DraftState, SequenceState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# one sequence's rows in one matmul or in several: BLAS may sum in another order
ROWS_REL_TOL = 1e-5
# the direct computation below sums in its own order (float64 where it is convenient)
DIRECT_REL_TOL = 1e-4
PROMPT = [3, 17, 250, 9, 77, 401, 5, 12]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {"mtp": write_synthetic(root / "mtp.gguf", layers=4, recipe="f32", widths=TINY, mtp=True),
            "plain": write_synthetic(root / "plain.gguf", layers=4, recipe="f32", widths=TINY),
            "mtp-q8_0": write_synthetic(root / "mtp-q8.gguf", layers=4, recipe="q8_0", widths=TINY, mtp=True)}


@pytest.fixture(scope="module")
def ref(files) -> ReferenceModel:
    return ReferenceModel(GGUFModel(files["mtp"]))


def prefilled(ref: ReferenceModel, prompt=PROMPT) -> SequenceState:
    state = ref.new_state()
    ref.prefill(prompt, state)
    return state


def same_state(a: SequenceState, b: SequenceState) -> None:
    assert a.pos == b.pos
    for x, y in zip(a.arrays(), b.arrays()):
        assert x.shape == y.shape and np.array_equal(x, y)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_has_mtp_only_with_the_block(files, ref):
    plain = ReferenceModel(GGUFModel(files["plain"]))
    assert ref.has_mtp and not plain.has_mtp
    with pytest.raises(ValueError, match="no MTP block"):
        plain.draft([[1]], np.zeros((1, TINY.hidden), np.float32), [ref.new_draft_state()])
    plain.set_draft_vocab(None)                  # the default: nothing to set
    with pytest.raises(ValueError, match="no MTP block"):
        plain.set_draft_vocab(np.arange(4))
    # the trunk of the file with the block is the trunk without it
    a, b = prefilled(plain), prefilled(ref)
    same_state(a, b)


def test_verify_is_decode_row_by_row(ref):
    rows = [40, 41, 300]
    seq, other = prefilled(ref), prefilled(ref, PROMPT[:5])
    want_logits, want_states = [], []
    s, o = seq.copy(), other.copy()
    for t in rows:
        want_logits.append(ref.decode([t], [s])[0])
        want_states.append(s.copy())
    other_logits = ref.decode([7], [o])[0]

    slots = ref.new_rollback(2)
    logits, hidden = ref.verify([rows, [7]], [seq, other], [slots, None])
    assert logits.shape == (4, TINY.vocab) and hidden.shape == (4, TINY.hidden)
    assert logits.dtype == hidden.dtype == np.float32
    for j in range(3):
        assert np.array_equal(logits[j], want_logits[j])
    assert np.array_equal(logits[3], other_logits)
    same_state(seq, want_states[-1])
    same_state(other, o)
    for j in range(2):                    # slot j: the recurrent state after row j
        for n in range(len(seq.conv)):
            assert np.array_equal(slots.conv[j][n], want_states[j].conv[n])
            assert np.array_equal(slots.ssm[j][n], want_states[j].ssm[n])
    # the hidden is after output_norm: the LM head of it gives the logits
    head = ref.w.get(ref.globals["head"])
    np.testing.assert_allclose(hidden @ head.T, logits, rtol=0, atol=ROWS_REL_TOL * np.abs(logits).max())


def test_verify_needs_its_rollback_slots(ref):
    state = prefilled(ref)
    with pytest.raises(ValueError, match="needs 2 rollback slots"):
        ref.verify([[1, 2, 3]], [state], [ref.new_rollback(1)])
    with pytest.raises(ValueError, match="needs 1 rollback slots, it has none"):
        ref.verify([[1, 2]], [state], [None])
    assert state.pos == len(PROMPT)        # checked before any row ran


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_keep_gives_the_sequential_state(ref, rows):
    drafts = [40, 41, 300]
    sequential = prefilled(ref)
    ref.decode([drafts[0]], [sequential])
    for t in drafts[1:rows]:
        ref.decode([t], [sequential])
    state, slots = prefilled(ref), ref.new_rollback(2)
    ref.verify([drafts], [state], [slots])
    ref.keep(state, slots, rows, 3)
    same_state(state, sequential)
    # and the next step from it is the sequential run's
    assert np.array_equal(ref.decode([99], [state]), ref.decode([99], [sequential]))
    with pytest.raises(ValueError, match="rows must be in"):
        ref.keep(state, slots, 0, 3)


def test_rollback_and_draft_state_bytes(ref):
    assert ref.rollback_bytes(3) == ref.new_rollback(3).nbytes > 0
    ds = ref.new_draft_state()
    assert ds.pos == 0 and ds.k.shape[0] == 0 and ds.k.dtype == np.float32
    ref.draft([list(range(5))], np.ones((5, TINY.hidden), np.float32), [ds])
    assert ref.draft_state_bytes(5) == ds.k.nbytes + ds.v.nbytes
    f16 = ReferenceModel(ref.model, kv_type="f16")
    assert f16.new_draft_state().k.dtype == np.float16
    assert f16.draft_state_bytes(5) == ref.draft_state_bytes(5) // 2


def _hidden(ref, rows: int) -> np.ndarray:
    state = prefilled(ref)
    _, h = ref.verify([list(range(20, 20 + rows))], [state], [ref.new_rollback(rows - 1)])
    return h


def test_draft_rows_in_one_call_or_several(ref):
    h, tokens = _hidden(ref, 3), [41, 300, 9]
    one = ref.new_draft_state()
    logits, h_out = ref.draft([tokens], h, [one])
    assert one.pos == 3 and logits.shape == (3, TINY.vocab) and h_out.shape == (3, TINY.hidden)
    split = ref.new_draft_state()
    l2, h2 = ref.draft([tokens[:2]], h[:2], [split])
    l1, h1 = ref.draft([tokens[2:]], h[2:], [split])
    assert split.pos == 3
    assert rel(np.concatenate([l2, l1]), logits) < ROWS_REL_TOL
    assert rel(np.concatenate([h2, h1]), h_out) < ROWS_REL_TOL
    # lowering pos drops rows: they are written again
    split.pos = 1
    l_again, _ = ref.draft([tokens[1:]], h[1:], [split])
    assert split.pos == 3 and rel(l_again, logits[1:]) < ROWS_REL_TOL
    # two sequences in one call: each over its own KV
    a, b = ref.new_draft_state(), ref.new_draft_state()
    both, _ = ref.draft([tokens, tokens[:1]], np.concatenate([h, h[:1]]), [a, b])
    assert (a.pos, b.pos) == (3, 1)
    assert rel(both[:3], logits) < ROWS_REL_TOL and rel(both[3:], logits[:1]) < ROWS_REL_TOL


def test_set_draft_vocab_slices_columns(ref):
    h = _hidden(ref, 2)
    full, h_full = ref.draft([[41, 300]], h, [ref.new_draft_state()])
    ids = np.array([0, 3, 41, 100, 511], np.int64)
    try:
        ref.set_draft_vocab(ids)
        part, h_part = ref.draft([[41, 300]], h, [ref.new_draft_state()])
        assert part.shape == (2, len(ids))
        assert rel(part, full[:, ids]) < ROWS_REL_TOL
        assert np.array_equal(h_part, h_full)
        with pytest.raises(ValueError, match="sorted"):
            ref.set_draft_vocab(np.array([5, 3]))
    finally:
        ref.set_draft_vocab(None)
    again, _ = ref.draft([[41, 300]], h, [ref.new_draft_state()])
    assert again.shape == full.shape and np.array_equal(again, full)


# ---- the draft step computed directly from the file's tensors, for a first row (one KV row)

def _norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x) + eps) * w


def _direct_first_row(model: GGUFModel, token: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cfg, N = model.config, model.config.n_layers
    t = lambda name: model.tensor(name).dequant().astype(np.float64)  # noqa: E731
    b, eps = f"blk.{N}.", cfg.rms_eps
    e = _norm(t("token_embd.weight")[token], t(b + "nextn.enorm.weight"), eps)
    u = t(b + "nextn.eh_proj.weight") @ np.concatenate([e, _norm(h, t(b + "nextn.hnorm.weight"), eps)])
    x = _norm(u, t(b + "attn_norm.weight"), eps)
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    gate = (t(b + "attn_q.weight") @ x).reshape(nh, 2 * hd)[:, hd:]
    v = (t(b + "attn_v.weight") @ x).reshape(nkv, hd)
    # one key: softmax is 1, so each head's output is its KV head's value, gated
    o = np.repeat(v, nh // nkv, axis=0) / (1 + np.exp(-gate))
    x = u + t(b + "attn_output.weight") @ o.reshape(-1)
    y = _norm(x, t(b + "post_attention_norm.weight"), eps)
    p = np.exp(t(b + "ffn_gate_inp.weight") @ y)
    p /= p.sum()
    top = np.argsort(-p)[:cfg.n_experts_used]
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    moe = np.zeros_like(y)
    for ex in top:
        g = t(b + "ffn_gate_exps.weight")[ex] @ y
        up = t(b + "ffn_up_exps.weight")[ex] @ y
        moe += p[ex] / p[top].sum() * (t(b + "ffn_down_exps.weight")[ex] @ (silu(g) * up))
    act = silu(t(b + "ffn_gate_shexp.weight") @ y) * (t(b + "ffn_up_shexp.weight") @ y)
    shared = t(b + "ffn_down_shexp.weight") @ act
    shared /= 1 + np.exp(-(t(b + "ffn_gate_inp_shexp.weight").reshape(-1) @ y))
    h_out = _norm(x + moe + shared, t(b + "nextn.shared_head_norm.weight"), eps)
    return t("output.weight") @ h_out, h_out


@pytest.mark.parametrize("name", ["mtp", "mtp-q8_0"])
def test_draft_matches_a_direct_computation(files, name):
    model = GGUFModel(files[name])
    ref = ReferenceModel(model)
    state = prefilled(ref)
    h = ref.hidden([55], state, recurrent=True)                  # [1, H], after output_norm
    logits, h_out = ref.draft([[300]], h, [ref.new_draft_state()])
    want_logits, want_h = _direct_first_row(model, 300, h[0])
    assert rel(h_out[0], want_h) < DIRECT_REL_TOL
    assert rel(logits[0], want_logits) < DIRECT_REL_TOL


def test_draft_kv_rows_are_the_mtp_attention_keys(ref):
    """The block's KV row r is k_proj of row r, normed and rotated at local position r."""
    h = _hidden(ref, 2)
    ds = ref.new_draft_state()
    ref.draft([[41, 300]], h, [ds])
    assert isinstance(ds, DraftState) and ds.k.shape[0] == 2
    fresh = ref.new_draft_state()
    ref.draft([[300]], h[1:], [fresh])              # row 1 alone at position 0
    # V carries no position: the row computed alone equals it; K differs by the rotation only
    np.testing.assert_allclose(fresh.v[0], ds.v[1], rtol=0, atol=ROWS_REL_TOL * np.abs(ds.v[1]).max())
    assert not np.allclose(fresh.k[0], ds.k[1])
    np.testing.assert_allclose(np.linalg.norm(fresh.k[0], axis=-1), np.linalg.norm(ds.k[1], axis=-1), rtol=1e-5)
