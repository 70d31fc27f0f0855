"""What a worker checks before native code sees a request (state shapes and dtypes against the
model, token ids, positions, sampling parameters, the decode address), that a bad request or
sequence fails alone, and how a PushQueue closes and notices a dead peer."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.gguf_file import GGUFModel
from common.mp import PushQueue
from common.protocol import ProtocolError, decode_frames, encode_message
from common.protocol.checks import check_decode, check_prefill, is_endpoint
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import PrefillRequest
from common.protocol.worker import Cancel
from common.sampling import SamplingParams
from common.state import SequenceState, check_state, state_specs, wire_limits
from tests.stack_helpers import write_tiny_gguf

KV = DEFAULT_KV_TYPE         # what the workers keep, unless a test says otherwise


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return GGUFModel(str(write_tiny_gguf(tmp_path_factory.mktemp("checks") / "tiny.gguf"))).config


def state_at(cfg, pos: int, kv_type: str = DEFAULT_KV_TYPE) -> list[np.ndarray]:
    return [np.zeros(shape, dtype) for _, dtype, shape in state_specs(pos, cfg, kv_type)]


def test_a_good_state_passes_and_each_bad_array_is_named(cfg):
    good = state_at(cfg, 3, "f32")
    check_state(3, good, cfg)
    n_lin = len(cfg.linear_layers)
    cases = {0: (np.zeros((1, 1), np.float32), "conv[0]"),
             n_lin: (np.zeros(good[n_lin].shape, np.float64), "ssm[0]"),
             2 * n_lin: (np.zeros((4, cfg.n_kv_heads, cfg.head_dim), np.float32), "k[0]"),
             len(good) - 1: (np.zeros(good[-1].size, np.float32), "v[0]")}
    for i, (bad, name) in cases.items():
        arrays = list(good)
        arrays[i] = bad
        with pytest.raises(ValueError, match=rf"state {re.escape(name)}"):
            SequenceState.from_arrays(3, arrays, cfg)
    for pos in (-1, cfg.context_length + 1):
        with pytest.raises(ValueError, match="position"):
            check_state(pos, good, cfg)
    with pytest.raises(ValueError, match="arrays"):
        check_state(0, [np.zeros(1, np.float32)], cfg)


def test_wire_limits_fit_the_largest_legitimate_frame(cfg):
    limits = wire_limits(cfg)
    kv = cfg.context_length * cfg.n_kv_heads * cfg.head_dim * 4
    assert limits.frame_bytes >= max(kv, cfg.vocab_size * 4) and limits.frame_bytes < 64 << 20
    assert limits.frames == 2 + len(state_at(cfg, 0))


def decode_request(cfg, **changes) -> DecodeRequest:
    fields = dict(rid="r", pos=2, history=[5, 6], sampling=SamplingParams(temperature=0.5, seed=1), max_tokens=4,
                  stop_ids=[0], return_state=False, state=state_at(cfg, 2),
                  logits=np.zeros(cfg.vocab_size, np.float32), kv_type=DEFAULT_KV_TYPE)
    return DecodeRequest(**{**fields, **changes})


def prefill_request(cfg, **changes) -> PrefillRequest:
    fields = dict(rid="r", tokens=[7, 8], history=[5, 6, 7, 8], start_pos=2, decode_address="tcp://127.0.0.1:5",
                  sampling=SamplingParams(), max_tokens=4, stop_ids=[], return_state=False,
                  start_state=state_at(cfg, 2), snapshot_every=0, kv_type=DEFAULT_KV_TYPE)
    return PrefillRequest(**{**fields, **changes})


def test_decode_request_checks(cfg):
    state, params = check_decode(decode_request(cfg), cfg, KV)
    assert state.pos == 2 and params.temperature == 0.5
    bad = {"history": [5, cfg.vocab_size], "stop_ids": [-1], "max_tokens": 0, "pos": 3,
           "sampling": {"temperature": -1.0}, "logits": np.zeros(3, np.float32), "state": None, "since": 3}
    for name, value in bad.items():
        with pytest.raises(ValueError):
            check_decode(decode_request(cfg, **{name: value}), cfg, KV)
    frames = [bytes(f) for f in encode_message(decode_request(cfg))]
    header = msgpack.unpackb(frames[0])
    good = header["f"]["sampling"]
    for sampling in ({"nope": 1}, {"top_k": "3"}, {"seed": -1}, {"top_p": True}, {"temperature": -1.0}):
        header["f"]["sampling"] = {**good, **sampling}
        with pytest.raises(ProtocolError, match="sampling"):          # the codec refuses it, naming the field
            decode_frames([msgpack.packb(header), *frames[1:]])


def test_prefill_request_checks(cfg):
    assert check_prefill(prefill_request(cfg), cfg, KV).pos == 2
    assert check_prefill(prefill_request(cfg, start_pos=0, start_state=None, tokens=[5, 6, 7, 8]), cfg, KV).pos == 0
    bad = {"tokens": [], "start_pos": 1, "history": [5, 6, 7], "decode_address": "tcp://x",
           "start_state": [np.zeros(1, np.float32)], "snapshot_every": -1, "max_tokens": -5}
    for name, value in bad.items():
        with pytest.raises(ValueError):
            check_prefill(prefill_request(cfg, **{name: value}), cfg, KV)
    with pytest.raises(ValueError, match="no start_state"):
        check_prefill(prefill_request(cfg, start_state=None), cfg, KV)
    long = list(range(cfg.context_length + 1))
    with pytest.raises(ValueError, match="context"):
        check_prefill(prefill_request(cfg, tokens=[t % 200 for t in long], history=[t % 200 for t in long],
                                      start_pos=0, start_state=None), cfg, KV)


def test_a_state_of_another_kv_type_is_refused_naming_both(cfg):
    f32 = state_at(cfg, 2, "f32")
    same_words = r"start the router, prefill and decode with the same --kv-type"
    with pytest.raises(ValueError, match=rf"keeps its KV cache in 'f32', this decode worker in 'f16' .*{same_words}"):
        check_decode(decode_request(cfg, state=f32, kv_type="f32"), cfg, "f16")
    with pytest.raises(ValueError, match=r"in 'q8_0', this prefill worker in 'f16'"):
        check_prefill(prefill_request(cfg, kv_type="q8_0"), cfg, "f16")
    # a state that says f16 but whose arrays are f32: the first K array is named, with the type
    with pytest.raises(ValueError, match=r"state k\[0\] is float32\[2, .*float16.*\(KV cache type f16\)"):
        check_decode(decode_request(cfg, state=f32, kv_type="f16"), cfg, "f16")
    with pytest.raises(ValueError, match=r"state k\[0\] is float16"):
        check_prefill(prefill_request(cfg, kv_type="f32", start_state=state_at(cfg, 2, "f16")), cfg, "f32")
    state = check_prefill(prefill_request(cfg, kv_type="f32", start_state=f32), cfg, "f32")
    assert state.kv_type == "f32" and state.k[0].dtype == np.float32


def test_decode_fails_a_request_of_another_kv_type_alone(cfg, decode_server):
    server, replies = decode_server
    assert server.kv_type == "f16" and server.runner.new_state().k[0].dtype == np.float16
    server.link._queue.put(decode_request(cfg, rid="f32", state=state_at(cfg, 2, "f32"), kv_type="f32"))
    server.link._queue.put(decode_request(cfg, rid="ok", max_tokens=2))
    for _ in range(3):
        server.step()
    assert [rid for rid, _ in replies.failed] == ["f32"]
    assert "in 'f32', this decode worker in 'f16'" in replies.failed[0][1]
    finished = [m for m in replies.sent if type(m).__name__ == "Finished"]
    assert [(m.rid, m.kv_type) for m in finished] == [("ok", "f16")]


@pytest.mark.parametrize("address, ok", [
    ("tcp://127.0.0.1:5557", True), ("tcp://decode-host.lan:1", True), ("tcp://[::1]:80", True),
    ("ipc:///tmp/fermium-decode", True), ("tcp://127.0.0.1:0", False), ("tcp://127.0.0.1:70000", False),
    ("tcp://127.0.0.1", False), ("tcp://*:5", False), ("inproc://x", False), ("", False), ("udp://h:1", False),
    ("tcp://a b:1", False), ("ipc://", False),
])
def test_decode_addresses(address, ok):
    assert is_endpoint(address) is ok


# ---- the workers: one bad request or sequence fails alone ---------------------------------

class Replies:
    """Stands in for WorkerLink's replies to the router."""

    def __init__(self, link):
        self.failed, self.sent = [], []
        link.fail = lambda rid, error: self.failed.append((rid, error))
        link.send = self.sent.append


@pytest.fixture
def decode_server(cfg, tmp_path_factory):
    from services.decode.config import DecodeConfig
    from services.decode.server import DecodeServer
    path = str(write_tiny_gguf(tmp_path_factory.mktemp("decode") / "tiny.gguf"))
    server = DecodeServer(DecodeConfig(path, router="tcp://127.0.0.1:9", runner="reference"))
    yield server, Replies(server.link)
    server.close()


def test_a_bad_state_or_sampler_fails_its_request_alone(cfg, decode_server):
    server, replies = decode_server
    bad_conv = state_at(cfg, 2)
    bad_conv[0] = np.zeros((1, 1), np.float32)
    for rid, changes in (("good", {}), ("good2", {}), ("bad-conv", {"state": bad_conv}),
                         ("bad-temp", {"sampling": {"temperature": -1.0}})):
        server.link._queue.put(decode_request(cfg, rid=rid, max_tokens=3, **changes))
    server.step()
    assert sorted(rid for rid, _ in replies.failed) == ["bad-conv", "bad-temp"]
    assert "conv[0]" in dict(replies.failed)["bad-conv"]
    victim = next(s for s in server.sched.running if s.rid == "good2")
    victim.sampler.sample = lambda *a: (_ for _ in ()).throw(FloatingPointError("probabilities are NaN"))
    for _ in range(5):
        server.step()
    assert [rid for rid, _ in replies.failed][2:] == ["good2"]
    finished = [m for m in replies.sent if type(m).__name__ == "Finished"]
    assert [(m.rid, m.reason) for m in finished] == [("good", "length")]


def test_an_engine_failure_fails_the_batch_and_serving_goes_on(cfg, decode_server):
    server, replies = decode_server
    server.link._queue.put(decode_request(cfg, rid="a", max_tokens=9))
    server.step()
    server.runner.decode = lambda *a: (_ for _ in ()).throw(MemoryError("scratch"))
    server.step()
    assert [rid for rid, _ in replies.failed] == ["a"] and not server.sched.running
    calls = []

    def step(*a):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        server.stop()

    server.step = step
    server.serve_forever()                 # the first step's exception did not escape
    assert len(calls) == 2


def test_prefill_bounds_and_reaps_its_decode_connections(cfg, tmp_path_factory, monkeypatch):
    from services.prefill import server as prefill_server
    from services.prefill.config import PrefillConfig
    path = str(write_tiny_gguf(tmp_path_factory.mktemp("prefill") / "tiny.gguf"))
    server = prefill_server.PrefillServer(PrefillConfig(path, router="tcp://127.0.0.1:9"))
    replies = Replies(server.link)
    try:
        server.link._queue.put(prefill_request(cfg, rid="bad-address", decode_address="tcp://nowhere"))
        server.step()
        assert [rid for rid, _ in replies.failed] == ["bad-address"] and not server.decoders
        queues = [server.decoders.get(f"tcp://127.0.0.1:{10 + i}") for i in range(prefill_server.MAX_DECODERS + 3)]
        assert len(server.decoders) == prefill_server.MAX_DECODERS
        assert all(q._stop.is_set() for q in queues[:3]) and not any(q._stop.is_set() for q in queues[3:])
        server.decoders.idle_s = 0.0
        server.step(timeout=0)
        assert not server.decoders and all(q._stop.is_set() for q in queues)
    finally:
        server.close()


# ---- PushQueue: closing never waits, and a dead peer is noticed -------------------------------

def test_push_close_returns_at_once_even_with_a_dead_peer():
    push = PushQueue("tcp://127.0.0.1:9", name="nobody")          # nothing listens: sends would wait
    for _ in range(3):
        push.put(Cancel("r", ""))
    t0 = time.monotonic()
    push.close()
    assert time.monotonic() - t0 < 0.05
    push.close(wait=2)
    assert not push._thread.is_alive()


CHILD_PULL = ("import sys, zmq; s = zmq.Context().socket(zmq.PULL); s.bind('tcp://127.0.0.1:0'); "
              "print(s.getsockopt_string(zmq.LAST_ENDPOINT), flush=True); s.recv(); print('got', flush=True); "
              "sys.stdin.read()")
DISCONNECT_WITHIN_S = 1.0


def test_on_disconnect_fires_once_when_the_peer_is_killed():
    child = subprocess.Popen([sys.executable, "-c", CHILD_PULL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    lost, calls = threading.Event(), []
    push = never = None
    try:
        address = child.stdout.readline().strip()
        push = PushQueue(address, name="watched", on_disconnect=lambda: (calls.append(1), lost.set()))
        never = PushQueue("tcp://127.0.0.1:9", name="never", on_disconnect=lambda: calls.append("never"))
        push.put(Cancel("r", ""))
        assert child.stdout.readline().strip() == "got"
        child.kill()
        killed = time.monotonic()
        assert lost.wait(5) and time.monotonic() - killed < DISCONNECT_WITHIN_S
        time.sleep(0.2)
        assert calls == [1]                  # once, and never for a peer that was never connected
    finally:
        child.kill()
        child.wait()
        for q in (push, never):
            if q is not None:
                q.close(wait=1)


# ---- DecodeStep: one message a step, every sequence's tokens, refused whole when any entry is bad ----

def step_frames(seqs: list[dict]) -> list[bytes]:
    """A DecodeStep's frames with these entry maps, as a worker could send them."""
    from common.protocol.router import DecodeStep, Tokens
    header = msgpack.unpackb(encode_message(DecodeStep("", "d1", [Tokens("a", [1])]))[0])
    header["f"]["seqs"] = [{"rid": "", "tokens": [1], "logprobs": [], "top_ids": [], "top_logprobs": [], **s}
                           for s in seqs]
    return [msgpack.packb(header)]


def test_a_decode_step_with_a_bad_entry_is_refused_naming_it_and_every_sequence():
    from common.protocol.router import MAX_STEP_SEQUENCES
    good = {"rid": "a"}
    cases = {"misaligned": ({"rid": "b", "tokens": [1, 2], "logprobs": [-0.5]},
                            r"seqs: \[1\] Tokens of 'b': logprobs, top_ids and top_logprobs must be aligned"),
             "tops": ({"rid": "b", "logprobs": [-0.5], "top_ids": [1, 2], "top_logprobs": [-0.5]},
                      "must be aligned"),
             "empty": ({"rid": "b", "tokens": []}, "Tokens of 'b': no tokens"),
             "twice": ({"rid": "a"}, "a sequence has two entries in one step"),
             "extra": ({"rid": "b", "worker_id": "x"},
                       r"seqs: \[1\] missing fields \[\], unknown fields \['worker_id'\]"),
             "type": ({"rid": "b", "tokens": ["1"]}, r"seqs: \[1\] tokens: items must be int64 integers")}
    for name, (bad, words) in cases.items():
        with pytest.raises(ProtocolError, match=words) as e:
            decode_frames(step_frames([good, bad]))
        assert set(e.value.rids) == {"a", "b"} if name != "twice" else e.value.rids == ("a",), name
    with pytest.raises(ProtocolError, match=f"{MAX_STEP_SEQUENCES + 1} sequences, at most {MAX_STEP_SEQUENCES}"):
        decode_frames(step_frames([{"rid": str(i)} for i in range(MAX_STEP_SEQUENCES + 1)]))
    assert len(decode_frames(step_frames([{"rid": str(i)} for i in range(MAX_STEP_SEQUENCES)])).seqs) == 1024


def test_decode_sends_one_step_message_for_every_sequence_and_each_end_after_it(cfg, decode_server):
    server, replies = decode_server
    for rid, n in (("a", 3), ("b", 3), ("c", 2)):
        server.link._queue.put(decode_request(cfg, rid=rid, max_tokens=n))
    for _ in range(4):
        server.step()
    kinds = [(type(m).__name__, [s.rid for s in m.seqs] if hasattr(m, "seqs") else m.rid) for m in replies.sent]
    # the first tokens, sampled on arrival, go before the step runs; the max_tokens-th token ends a sequence
    assert kinds == [("DecodeStep", ["a", "b", "c"]), ("DecodeStep", ["a", "b", "c"]), ("Finished", "c"),
                     ("DecodeStep", ["a", "b"]), ("Finished", "a"), ("Finished", "b")]
    steps = [m for m in replies.sent if type(m).__name__ == "DecodeStep"]
    assert all(len(s.tokens) == 1 for m in steps for s in m.seqs)


def test_decode_ends_with_the_kv_rows_past_since_and_counts_only_those(cfg, decode_server):
    server, replies = decode_server
    n_lin, sent = len(cfg.linear_layers), server.metrics.registry.get_sample_value
    for rid, since in (("past", 1), ("whole", 0)):
        server.link._queue.put(decode_request(cfg, rid=rid, max_tokens=4, return_state=True, since=since))
    for _ in range(4):
        server.step()
    ends = {m.rid: m for m in replies.sent if type(m).__name__ == "Finished"}
    assert {rid: (m.pos, m.since, m.k[0].shape[0], len(m.recurrent)) for rid, m in ends.items()} == {
        "past": (5, 1, 4, 2 * n_lin), "whole": (5, 0, 5, 2 * n_lin)}
    whole = ends["whole"]
    assert np.array_equal(ends["past"].k[0], whole.k[0][1:]) and np.array_equal(ends["past"].v[-1], whole.v[-1][1:])
    assert sent("fermium_decode_state_bytes_sent_total", {"to": "router"}) == ends["past"].state_bytes() + sum(
        a.nbytes for a in [*whole.recurrent, *whole.k, *whole.v])


def test_the_router_delivers_a_step_to_its_tracks_and_refuses_a_sequence_another_worker_decodes():
    from common.metrics import RouterMetrics
    from common.protocol.router import DecodeStep, Tokens
    from services.router.engine.decode_steps import deliver
    from services.router.engine.track import Track
    metrics, orphans, cancels = RouterMetrics(), [], []
    tracks = {"a": Track("a", (1,), "", "d1"), "b": Track("b", (1,), "", "d2")}
    deliver(DecodeStep("", "d1", [Tokens("a", [5, 6]), Tokens("b", [7]), Tokens("gone", [8])]), tracks, metrics,
            lambda rid, why: cancels.append(rid), lambda rid, wid: orphans.append((rid, wid)))
    assert tracks["a"].generated == [5, 6] and tracks["a"].events.get_nowait() == Tokens("a", [5, 6])
    assert tracks["b"].generated == [] and tracks["b"].events.empty()          # d2 decodes it: refused
    assert metrics.protocol_errors.labels("router", "invalid")._value.get() == 1
    assert orphans == [("gone", "d1")] and cancels == []


def test_the_router_fails_every_sequence_of_a_refused_step():
    from common.metrics import RouterMetrics
    from services.router.engine.dispatch import Dispatcher
    from services.router.engine.track import Track
    d = Dispatcher("tcp://127.0.0.1:9", heartbeat_timeout=5, metrics=RouterMetrics(), token="t")
    for rid in ("a", "b"):
        d.tracks[rid] = Track(rid, (1,), "", "d1")
    with pytest.raises(ProtocolError) as e:
        decode_frames(step_frames([{"rid": "a"}, {"rid": "b", "tokens": [1, 2], "logprobs": [-0.5]}]))
    d._rejected(e.value)
    for rid in ("a", "b"):
        failed = d.tracks[rid].events.get_nowait()
        assert type(failed).__name__ == "Failed" and "router rejected a reply: DecodeStep.seqs: [1]" in failed.error
