"""Snapshots that carry only the KV rows the router lacks: the prefill side's rows, the router's
chains that assemble each state from the blocks it holds (each block taken once), the store's
put of such parts, and the refusal of every delta that does not follow; and the final states
that decode sends the same way (the rows past the prompt's snapshot), kept or dropped counted."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.metrics import RouterMetrics
from common.protocol.prefill import PrefillRequest
from common.protocol.router import Finished, Snapshot
from common.sampling import SamplingParams
from common.snapshots import KV_BLOCK, SnapshotStore
from common.snapshots.parts import KvParts
from services.prefill.snapshot_rows import SnapshotRows
from services.router.engine.dispatch import Dispatcher
from services.router.engine.prefix_cache import SnapshotCache
from services.router.engine.request import Request
from services.router.engine.snapshot_chains import SnapshotChains, SnapshotRefused
from tests.test_n_choices import Recorder
from tests.test_snapshot_store import CFG, assert_same, state_after

TOKENS = [int(t) for t in np.random.default_rng(3).integers(1, CFG.vocab_size, 300)]
CUTS = [0, 5, 64, 70, 200, 300]          # inside a block, on one, a few rows, several blocks at once


def delta(rid: str, since: int, pos: int, worker: str = "p", tokens=TOKENS) -> Snapshot:
    s = state_after(tokens[:pos])
    return Snapshot(rid, worker, pos, since, [*s.conv, *s.ssm], [k[since:] for k in s.k], [v[since:] for v in s.v],
                    np.full(CFG.vocab_size, pos, np.float32), "f32")


def test_parts_extended_row_by_row_are_the_whole_kv_and_keep_their_blocks():
    parts = KvParts.empty()
    for a, b in zip(CUTS, CUTS[1:]):
        s, before = state_after(TOKENS[:b]), list(parts.blocks)
        parts.check_rows([k[a:] for k in s.k], [v[a:] for v in s.v], b - a)
        parts = parts.extend([k[a:] for k in s.k], [v[a:] for v in s.v], b - a, KV_BLOCK)
        ks, vs = parts.arrays()
        assert parts.pos == b and len(parts.blocks) == b // KV_BLOCK
        assert np.array_equal(ks[0], s.k[0]) and np.array_equal(vs[0], s.v[0])
        assert all(x is y for x, y in zip(parts.blocks, before))          # the rows before: never copied


def test_the_store_assembles_each_snapshot_from_its_blocks_and_takes_each_block_once():
    store = SnapshotStore(CFG, 1 << 30, block=KV_BLOCK, kv_type="f32")
    chains = SnapshotChains()
    chains.begin("r", "p", len(TOKENS), "f32", KvParts.empty())
    for a, b in zip(CUTS, CUTS[1:]):
        msg = delta("r", a, b)
        store.put_parts(TOKENS[:b], chains.extend(msg), msg.recurrent, msg.logits)
        state, logits = store.lookup(TOKENS[:b])
        assert_same(state, state_after(TOKENS[:b])) and logits[0] == b
    assert len(store.kv_blocks) == len(TOKENS) // KV_BLOCK
    # another request from the snapshot at 200: its chain starts from the store's own blocks
    other = TOKENS[:200] + [7] * 80
    start = store.parts(TOKENS[:200])
    chains.begin("r2", "p", len(other), "f32", start)
    msg = delta("r2", 200, 280, tokens=other)
    parts = chains.extend(msg)
    store.put_parts(other, parts, msg.recurrent, msg.logits)
    assert all(parts.blocks[i] is store.kv_blocks[key] for i, key in enumerate(store.snaps[next(reversed(
        store.snaps))].blocks))
    assert_same(store.lookup(other)[0], state_after(other))


def bad_deltas():
    good = delta("r", 70, 200)
    rows = dataclasses.replace(good, k=[k[1:] for k in good.k], v=[v[1:] for v in good.v])
    return {"an unknown request": (dataclasses.replace(good, rid="nobody"), "no prefill of its request"),
            "another worker": (dataclasses.replace(good, worker_id="q"), "went to p, not to q"),
            "a since that does not follow": (delta("r", 64, 200), "start at 64, .* ends at 70"),
            "a position that does not follow": (dataclasses.replace(good, since=70, pos=70), "does not follow"),
            "a position past the prompt": (dataclasses.replace(good, pos=301), "does not follow"),
            "too few rows": (rows, r"130 rows"),
            "rows of another width": (dataclasses.replace(good, k=[k[:, :, :2] for k in good.k]), r"130 rows"),
            "a layer missing": (dataclasses.replace(good, k=[], v=[]), "full-attention layers"),
            "K and V that differ": (dataclasses.replace(good, v=[v[:, :, :2] for v in good.v]), r"v\[0\]"),
            "another KV type": (dataclasses.replace(good, kv_type="f16"), "KV type"),
            "rows of another dtype": (dataclasses.replace(good, k=[k.astype(np.float64) for k in good.k]), "rows of")}


@pytest.mark.parametrize("case", list(bad_deltas()))
def test_a_delta_that_does_not_follow_is_refused_and_the_chain_stays(case):
    chains = SnapshotChains()
    chains.begin("r", "p", len(TOKENS), "f32", KvParts.empty())
    chains.extend(delta("r", 0, 70))
    msg, why = bad_deltas()[case]
    with pytest.raises(SnapshotRefused, match=why) as e:
        chains.extend(msg)
    assert not e.value.late
    ks, _ = chains.extend(delta("r", 70, 200)).arrays()              # the good one still follows
    assert np.array_equal(ks[0], state_after(TOKENS[:200]).k[0])


def test_a_delta_of_a_request_that_ended_is_dropped_quietly():
    chains = SnapshotChains()
    chains.begin("r", "p", len(TOKENS), "f32", KvParts.empty())
    chains.end("r")
    with pytest.raises(SnapshotRefused) as e:
        chains.extend(delta("r", 0, 70))
    assert e.value.late and "r" not in chains


def test_prefill_sends_the_rows_since_the_previous_snapshot_of_the_request():
    rows = SnapshotRows()
    req = PrefillRequest("a", TOKENS[64:], TOKENS, 64, "tcp://d:1", SamplingParams(), 1, [], False, None, 64, "f32")
    rows.start(req)
    sent = []
    for pos in (128, 200, 300):
        s = state_after(TOKENS[:pos])
        sent.append(rows.message(req, "p", pos, s, np.zeros(CFG.vocab_size, np.float32)))
    assert [(m.since, m.pos, m.k[0].shape[0]) for m in sent] == [(64, 128, 64), (128, 200, 72), (200, 300, 100)]
    assert np.array_equal(sent[1].v[0], state_after(TOKENS[:200]).v[0][128:])
    rows.start(dataclasses.replace(req, rid="b", start_pos=0, tokens=TOKENS))
    assert rows.message(dataclasses.replace(req, rid="b", start_pos=0), "p", 10, state_after(TOKENS[:10]),
                        np.zeros(CFG.vocab_size, np.float32)).since == 0


def dispatcher_with_store():
    store = SnapshotStore(CFG, 1 << 30, block=KV_BLOCK, kv_type="f32")
    metrics = RouterMetrics()
    d = Dispatcher("inproc://deltas", heartbeat_timeout=10, metrics=metrics, kv_type="f32",
                   cache=SnapshotCache(CFG, store, metrics, 64))
    links: dict[str, Recorder] = {}
    d.registry._connect = lambda address: links.setdefault(address, Recorder())
    d.registry.register("p", "prefill", "tcp://p:1", 1, "m")
    d.registry.register("d", "decode", "tcp://d:1", 4, "m")
    return d, store, links


def test_the_dispatcher_stores_good_deltas_and_refuses_a_hostile_one_without_failing_the_request():
    d, store, links = dispatcher_with_store()
    tracks = d.submit_copies(Request(tuple(TOKENS), 4, SamplingParams(temperature=1.0, seed=5), n=2), (9,), 2)
    (req,) = links["tcp://p:1"].sent
    d._handle(delta(req.rid, 0, 64))
    d._handle(dataclasses.replace(delta(req.rid, 64, 128), since=0))                 # does not follow: refused
    assert d.metrics.registry.get_sample_value("fermium_protocol_errors_total",
                                               {"service": "router", "reason": "invalid"}) == 1
    for a, b in ((64, 128), (128, 300)):
        d._handle(delta(req.rid, a, b))
    assert len(store.snaps) == 3 and len(store.kv_blocks) == 4
    (copy,) = links["tcp://d:1"].sent                                               # choice 1, from the end
    want = state_after(TOKENS)
    assert copy.rid == tracks[1].rid and all(np.array_equal(x, y) for x, y in zip(copy.state, want.arrays()))
    assert tracks[0].events.empty()                                                  # nothing failed
    d._handle(delta("stranger", 0, 64))                                              # unknown: refused, no crash
    assert len(store.snaps) == 3


def finished(rid: str, pos: int, since: int, tokens=TOKENS, **changes) -> Finished:
    s = state_after(tokens[:pos])
    msg = Finished(rid, "d", "length", 1, pos, since, [*s.conv, *s.ssm], [k[since:] for k in s.k],
                   [v[since:] for v in s.v], np.full(CFG.vocab_size, pos, np.float32), "f32")
    return dataclasses.replace(msg, **changes)


def ended(since: int, **changes):
    """A request for TOKENS[:200] prefilled with Snapshots at 64 and at its end, that generated 30 tokens
    and ended with a Finished at 229 carrying the KV rows past `since`; (dispatcher, store, track, its metrics)."""
    d, store, links = dispatcher_with_store()
    track = d.submit(Request(tuple(TOKENS[:200]), 30, SamplingParams()), (9,))
    (req,) = links["tcp://p:1"].sent
    for a, b in ((0, 64), (64, 200)):
        d._handle(delta(req.rid, a, b))
    track.generated.extend(TOKENS[200:230])
    d._handle(finished(track.rid, 229, since, **changes))
    assert not track.events.empty()                          # it ended, whatever became of its state
    return d, store, track, lambda name, **labels: d.metrics.registry.get_sample_value(name, labels)


def test_the_dispatcher_keeps_a_final_state_from_the_prompts_snapshot_and_the_rows_decode_sent():
    for since in (200, 0):                   # the prompt's end, whose snapshot the router holds; the whole state
        d, store, track, metric = ended(since)
        assert metric("fermium_snapshot_stored_total", source="decode") == 1
        state, logits = store.lookup(TOKENS[:229])
        assert_same(state, state_after(TOKENS[:229])) and state.pos == 229 and logits[0] == 229
        assert len(store.kv_blocks) == 3                     # its whole blocks: the prompt's own, taken once


def test_a_final_state_whose_rows_do_not_follow_a_held_snapshot_is_dropped_and_counted():
    s = state_after(TOKENS[:229])
    cases = {"unheld": {"since": 100},       # the router holds no snapshot at 100
             "invalid": {"since": 200, "k": [k[200:, :, :2] for k in s.k], "v": [v[200:, :, :2] for v in s.v]}}
    for reason, changes in cases.items():
        d, store, track, metric = ended(**changes)
        assert metric("fermium_final_states_dropped_total", reason=reason) == 1
        assert metric("fermium_snapshot_stored_total", source="decode") == 0
        assert store.lookup(TOKENS[:229])[0].pos == 200      # the prompt's snapshot is what a next turn finds
        assert metric("fermium_protocol_errors_total", service="router", reason="invalid") == (reason == "invalid")
    d, store, track, metric = ended(200, recurrent=None, k=None, v=None, logits=None)     # not asked for
    assert metric("fermium_snapshot_stored_total", source="decode") == 0
    assert sum(metric("fermium_final_states_dropped_total", reason=r) for r in ("unheld", "invalid")) == 0
