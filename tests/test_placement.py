"""Placement in units: the prefill pick rule (a holder wins unless clearly busier), decode by free
batch slots with the fallback to load, the router's belief of who holds what and its resend, the
prefill worker's held states (budget, LRU, keys as the snapshot store's), and a prefill worker in
this process that starts from a held state exactly as from the same state's bytes."""
from __future__ import annotations

import numpy as np
import pytest

from common.kv_cache import DEFAULT_KV_TYPE
from common.metrics import RouterMetrics
from common.model.gguf_file import GGUFModel
from common.protocol.prefill import HoldState, PrefillRequest
from common.protocol.router import NotHeld
from common.sampling import SamplingParams
from common.snapshots import KV_BLOCK, SnapshotStore
from common.snapshots.keys import prefix_key
from common.state import SequenceState, state_specs
from services.prefill.held import HeldStates
from services.router.engine.placement import HOLDER_SLACK, Holdings, Placement, pick_prefill
from services.router.engine.workers import Worker, WorkerRegistry
from tests.stack_helpers import write_tiny_gguf


class Link:
    def __init__(self):
        self.sent = []

    def put(self, msg) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        pass


def worker(wid: str, role: str = "prefill", inflight: int = 0, capacity: int = 1, slots: int = 0,
           reported: tuple[int, int] = (0, 0), hold_budget: int = 1 << 30) -> Worker:
    return Worker(wid, role, f"tcp://{wid}:1", capacity, "m", Link(), 0.0, reported,
                  {f"{wid}-{i}" for i in range(inflight)}, slots, hold_budget)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return GGUFModel(str(write_tiny_gguf(tmp_path_factory.mktemp("placement") / "tiny.gguf"))).config


def state_at(cfg, pos: int, fill: float = 0.0) -> SequenceState:
    arrays = [np.full(shape, fill, dtype) for _, dtype, shape in state_specs(pos, cfg, DEFAULT_KV_TYPE)]
    return SequenceState.from_arrays(pos, arrays, cfg, DEFAULT_KV_TYPE)


# ---- the pick rules

def test_a_holder_wins_unless_clearly_busier():
    a, b = worker("a"), worker("b")
    assert pick_prefill([a, b], set()) == (a, False)                  # no holder: the least loaded, first of ties
    assert pick_prefill([a, b], {"b"}) == (b, True)
    busy = worker("b", inflight=int(HOLDER_SLACK))                    # one prompt ahead: still worth the wait
    assert pick_prefill([a, busy], {"b"}) == (busy, True)
    busier = worker("b", inflight=int(HOLDER_SLACK) + 1)
    assert pick_prefill([a, busier], {"b"}) == (a, False)
    assert pick_prefill([a, worker("c", inflight=3), busy], {"c", "b"}) == (busy, True)   # the least loaded holder
    assert pick_prefill([worker("d", "decode")], set()) == (None, False)


def test_decode_goes_by_free_slots_and_by_load_while_any_is_unknown():
    reg = WorkerRegistry(timeout=2.0, connect=lambda address: Link())
    reg.register("small", "decode", "tcp://s:1", 64, "m", slots=1)
    reg.register("big", "decode", "tcp://b:1", 64, "m", slots=4)
    assert reg.pick("decode").worker_id == "big"
    reg.workers["big"].inflight |= {"r1", "r2", "r3"}                 # sent since its last heartbeat
    assert reg.workers["big"].free_slots == 1 and reg.pick("decode").worker_id == "small"   # a tie: less load
    reg.heartbeat("small", 1, 2, slots=1)
    assert reg.workers["small"].free_slots == -2 and reg.pick("decode").worker_id == "big"
    reg.register("old", "decode", "tcp://o:1", 64, "m")             # reports no slots: by load alone
    assert reg.workers["old"].free_slots is None and reg.pick("decode").worker_id == "old"
    reg.heartbeat("small", 0, 0, slots=0)
    assert reg.workers["small"].free_slots is None


def test_holdings_remember_the_latest_keys_and_forget_a_dropped_holder():
    h = Holdings(max_keys=2)
    h.add(b"k1", "a")
    h.add(b"k1", "b")
    h.add(b"k2", "a")
    assert h.holders(b"k1") == {"a", "b"}
    h.drop(b"k1", "a")
    assert h.holders(b"k1") == {"b"}
    h.add(b"k3", "a")                                                  # k1 is the least recently added
    assert h.holders(b"k1") == set() and h.holders(b"k2") == {"a"} and h.holders(b"k3") == {"a"}


def request(ids: list[int], start: int, held: str = "", state=None, hold: bool = True) -> PrefillRequest:
    return PrefillRequest("r", ids[start:], ids, start, "tcp://d:1", SamplingParams(), 4, [], True, state, 0,
                          DEFAULT_KV_TYPE, held=held, hold=hold)


def test_placement_names_a_held_state_and_resends_its_bytes_when_it_is_gone(cfg):
    metrics = RouterMetrics()
    sample = lambda name, **labels: metrics.registry.get_sample_value(name, labels) or 0.0   # noqa: E731
    p = Placement(metrics)
    a, b = worker("a"), worker("b")
    ids = tuple(range(1, 90))
    state = state_at(cfg, 80).arrays()
    size = sum(x.nbytes for x in state)
    plan = p.plan([a, b], ids, 80, state, True)
    assert plan.worker is a and plan.held == "" and plan.hold                    # nobody holds it: sent
    p.send(a, request(list(ids), 80, state=state), state)
    assert sample("fermium_state_bytes_sent_total", role="prefill") == size
    plan = p.plan([b, a], ids, 80, state, True)                                  # a keeps what it was sent
    assert plan.worker is a and plan.held == prefix_key(list(ids[:80]), KV_BLOCK).hex()
    assert p.plan([b, worker("a", hold_budget=size - 1)], ids, 80, state, True).held == ""  # it cannot fit
    assert p.plan([b, a], ids, 80, state, False).held == ""                     # images: never held
    req = request(list(ids), 80, held=plan.held)
    p.send(a, req, state)
    assert sample("fermium_state_bytes_sent_total", role="prefill") == size       # named, not sent
    assert p.resend(a, "r")                                                       # NotHeld: again, with the bytes
    again = a.link.sent[-1]
    assert again.held == "" and again.start_state is state and again.tokens == req.tokens
    assert sample("fermium_state_bytes_sent_total", role="prefill") == 2 * size
    assert sample("fermium_state_resends_total") == 1 and not p.resend(a, "r")
    p.send(a, req, state)
    p.done("r", True)
    assert sample("fermium_state_transfers_skipped_total") == 1 and sample("fermium_state_bytes_skipped_total") == size


# ---- the prefill worker's held states

def test_held_states_keep_a_byte_budget_lru_under_the_store_keys(cfg):
    one = state_at(cfg, 10).nbytes
    held = HeldStates(int(2.5 * one))
    tokens = [list(range(i, i + 10)) for i in range(4)]
    for t in tokens[:3]:
        held.put(t, state_at(cfg, 10))
    key = lambda t: prefix_key(t, KV_BLOCK).hex()                   # noqa: E731
    assert len(held) == 2 and held.get(key(tokens[0]), 10) is None and held.evictions == 1
    assert held.get(key(tokens[1]), 10) is not None                  # now the most recent
    held.put(tokens[3], state_at(cfg, 10))
    assert held.get(key(tokens[2]), 10) is None and held.get(key(tokens[1]), 10) is not None
    assert held.get(key(tokens[1]), 11) is None                      # another position: not that state
    assert held.bytes == 2 * one
    small = HeldStates(one - 1)                                       # over the whole budget: not kept
    small.put(tokens[0], state_at(cfg, 10))
    assert len(small) == 0 and small.bytes == 0
    with pytest.raises(ValueError):
        held.put([1, 2], state_at(cfg, 3))
    store = SnapshotStore(cfg, 1 << 30, kv_type=DEFAULT_KV_TYPE)
    assert store.put(tokens[1], state_at(cfg, 10), np.zeros(cfg.vocab_size, np.float32)).hex() == key(tokens[1])


class Decoder:
    def __init__(self):
        self.sent = []

    def put(self, msg) -> None:
        self.sent.append(msg)


def test_a_held_state_prefills_as_its_bytes_do_and_a_missing_one_is_answered(cfg, tmp_path):
    from services.prefill.config import PrefillConfig
    from services.prefill.server import PrefillServer
    server = PrefillServer(PrefillConfig(str(write_tiny_gguf(tmp_path / "tiny.gguf")), router="tcp://127.0.0.1:9"))
    decoder, replies = Decoder(), []
    server.decoders.get = lambda address: decoder
    server.link.send = replies.append
    ids = [int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, 60)]
    try:
        def run(req) -> None:
            server.link._queue.put(req)
            server.step(timeout=0)
        run(request(ids[:40], 0))
        first = decoder.sent[-1]
        assert first.hold_at == server.link.address
        run(HoldState("r", "decode-1", 40, ids[:40], first.state, DEFAULT_KV_TYPE))    # as decode sends it back
        run(request(ids, 40, state=[a.copy() for a in first.state], hold=False))
        sent = decoder.sent[-1]
        run(request(ids, 40, held=prefix_key(ids[:40], KV_BLOCK).hex(), hold=False))
        named = decoder.sent[-1]
        assert named is not sent and named.hold_at == ""
        np.testing.assert_array_equal(named.logits, sent.logits)
        for x, y in zip(named.state, sent.state):
            np.testing.assert_array_equal(x, y)
        run(request(ids, 40, held=prefix_key(ids[:39] + [0], KV_BLOCK).hex()))
        assert decoder.sent[-1] is named and isinstance(replies[-1], NotHeld)
        assert len(server.held) == 1
        for bad in (ids[:39] + [cfg.vocab_size], ids[:39]):               # an id beyond the vocabulary; one short
            run(HoldState("bad", "decode-1", 40, bad, first.state, DEFAULT_KV_TYPE))
        assert len(server.held) == 1 and server.metrics.registry.get_sample_value(
            "fermium_protocol_errors_total", {"service": "prefill", "reason": "invalid"}) == 2
        hits = server.metrics.registry.get_sample_value
        assert hits("fermium_prefill_held_lookups_total", {"outcome": "hit"}) == 1
        assert hits("fermium_prefill_held_lookups_total", {"outcome": "miss"}) == 1
        one = SequenceState.from_arrays(40, list(first.state), cfg, DEFAULT_KV_TYPE).nbytes
        assert hits("fermium_prefill_state_bytes_received_total", {"source": "decode"}) == 3 * one   # refused too
        assert hits("fermium_prefill_state_bytes_received_total", {"source": "router"}) == one
    finally:
        server.close()


# ---- the wire

def test_placement_fields_and_kinds_round_trip_and_another_version_is_refused(cfg):
    import msgpack

    from common.protocol import VERSION, ProtocolError, decode_frames, encode_message
    from common.protocol.decode import DecodeRequest
    from common.protocol.router import Heartbeat, Hello
    state = state_at(cfg, 3, 0.5).arrays()
    messages = [Hello("h", "decode-1", "decode", "tcp://d:1", 8, "m", "t", "f16", 4, 0),
                Heartbeat("b", "prefill-1", "prefill", "tcp://p:1", 1, "m", 1, 0, "t", "f16", 0, 1 << 31),
                request(list(range(5)), 3, held="ab" * 16),
                DecodeRequest("d", 3, [1, 2, 3], SamplingParams(), 4, [], True, state,
                              np.zeros(cfg.vocab_size, np.float32), DEFAULT_KV_TYPE, 0, "tcp://p:1"),
                HoldState("s", "decode-1", 3, [1, 2, 3], state, DEFAULT_KV_TYPE),
                NotHeld("n", "prefill-1", "ab" * 16)]
    for msg in messages:
        frames = [bytes(f) for f in encode_message(msg)]
        back = decode_frames(frames)
        for name in msg.__dataclass_fields__:
            a, b = getattr(msg, name), getattr(back, name)
            if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
                assert all(np.array_equal(x, y) for x, y in zip(a, b))
            elif isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b, name
    header = msgpack.unpackb(encode_message(messages[0])[0])
    older = [msgpack.packb({**header, "v": VERSION - 1})]
    with pytest.raises(ProtocolError, match=f"protocol version {VERSION - 1}, this build speaks {VERSION}"):
        decode_frames(older)
