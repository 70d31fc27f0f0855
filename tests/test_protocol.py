"""Wire protocol: round trips of every message, zero-copy arrays, and rejection of every kind
of malformed frame, both by the codec and by a live inbox that must keep serving."""
from __future__ import annotations

import dataclasses
import re
import time

import msgpack
import numpy as np
import pytest
import zmq

from common import protocol
from common.mp import PullQueue, open_socket
from common.protocol import VERSION, ProtocolError, decode_frames, encode_message
from common.protocol.codec import kinds
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import PrefillRequest
from common.protocol.router import DecodeStep, Failed, Finished, Heartbeat, Hello, PrefillDone, Snapshot, Tokens
from common.protocol.worker import Cancel, HelloAck
from common.sampling import SamplingParams
from common.worker import WorkerLink

RECV_TIMEOUT_S = 5.0


def state(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((4, 8, 8)).astype(np.float32),
            np.zeros((0, 2, 16), np.float32), rng.standard_normal((5, 2, 16)).astype(np.float16)]


SAMPLES = [
    Hello("h1", "decode-1", "decode", "tcp://127.0.0.1:1", 8, "m.gguf", "t", "f16"),
    Heartbeat("h2", "decode-1", "decode", "tcp://127.0.0.1:1", 8, "m.gguf", 3, 1, "t", "q8_0"),
    PrefillDone("r1", "prefill-1", 17, 0.25),
    DecodeStep("", "decode-1", [Tokens("r1", [5, 6, 7])]),
    DecodeStep("", "decode-1", [Tokens("r1", [5, 6], [-0.25, -1.5], [5, 2, 9, 6], [-0.25, -2.0, -0.5, -1.5]),
                                Tokens("r2", [8])]),
    Finished("r1", "decode-1", "length", 9, 26, 0, None, None, None, None, "f16"),
    Finished("r1", "decode-1", "stop", 9, 26, 21, state(1)[:2], state(5)[3:], state(6)[3:], np.ones(11, np.float32),
             "f16"),
    Finished("r1", "decode-1", "stop", 9, 5, 0, state(1)[:2], state(5)[3:], state(6)[3:], np.ones(11, np.float32),
             "f16"),
    Failed("r1", "prefill-1", "boom"),
    HelloAck("h1", "decode-1", True, ""),
    Cancel("r1", "client disconnected"),
    PrefillRequest("r2", [1, 2], [9, 1, 2], 1, "tcp://127.0.0.1:2", SamplingParams(top_p=0.5, seed=7), 16, [3],
                   False, None, 0, "f32"),
    PrefillRequest("r2", [1, 2], [9, 1, 2], 1, "tcp://127.0.0.1:2", SamplingParams(), 16, [], True, state(2), 64,
                   "f16"),
    Snapshot("r2", "prefill-1", 7, 2, state(2)[:2], state(3)[3:], state(4)[3:], np.ones(11, np.float32), "f16"),
    DecodeRequest("r3", 3, [1, 2, 3], SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0,
                                                     logit_bias={7: -100, "2": 3.5}, logprobs=True, top_logprobs=2),
                  5, [0], False, state(3), np.arange(11, dtype=np.float32), "f16"),
    DecodeRequest("r3", 3, [1, 2, 3], SamplingParams(top_k=4), 5, [0], False, state(3),
                  np.arange(11, dtype=np.float32), "f16"),
]


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frames = encode_message(msg)
    back = decode_frames([bytes(f) for f in frames])
    assert type(back) is type(msg)
    for f in dataclasses.fields(msg):
        assert same(getattr(msg, f.name), getattr(back, f.name)), f.name


def test_arrays_are_separate_frames_without_copies():
    msg = SAMPLES[-1]
    frames = encode_message(msg)
    assert len(frames) == 1 + len(msg.state) + 1
    for arr, frame in zip(msg.state, frames[1:]):
        if arr.size:
            assert np.shares_memory(arr, np.frombuffer(frame, arr.dtype))
    header = msgpack.unpackb(frames[0])
    assert header["v"] == VERSION and header["k"] == DecodeRequest.KIND
    assert header["a"]["logits"] == ["float32", [11], len(frames) - 1]


def test_kinds_are_single_bytes_and_documented():
    for kind, cls in kinds().items():
        assert 0 <= kind <= 255
        module = __import__(cls.__module__, fromlist=["_"])
        assert re.search(rf"0x{kind:02x} {cls.__name__}\b", module.__doc__), f"{cls.__name__} missing from docstring"
    assert "VERSION" in protocol.codec.__doc__ and "frame 0" in protocol.codec.__doc__


def _header(frames) -> dict:
    return msgpack.unpackb(frames[0])


def _with_header(frames, **changes) -> list:
    h = _header(frames)
    h.update(changes)
    return [msgpack.packb(h), *frames[1:]]


GOOD = encode_message(SAMPLES[-1])


def _sampling(**changes) -> list:
    f = _header(GOOD)["f"]
    return _with_header(GOOD, f={**f, "sampling": {**f["sampling"], **changes}})


@pytest.mark.parametrize("frames, needle", [
    ([], "empty"),
    ([b"\xc1\xc1not msgpack"], "not msgpack"),
    ([msgpack.packb([1, 2])], "must be a map"),
    (_with_header(GOOD, v=VERSION + 1), "protocol version"),
    (_with_header(GOOD, k=0xEE), "unknown message kind"),
    (_with_header(GOOD, f={**_header(GOOD)["f"], "extra": 1}), "unknown fields ['extra']"),
    (_with_header(GOOD, f={k: v for k, v in _header(GOOD)["f"].items() if k != "pos"}), "missing fields ['pos']"),
    (_with_header(GOOD, f={**_header(GOOD)["f"], "pos": "3"}), "DecodeRequest.pos: str"),
    (_with_header(GOOD, f={**_header(GOOD)["f"], "pos": True}), "DecodeRequest.pos: bool"),
    (_with_header(GOOD, a={**_header(GOOD)["a"], "logits": ["complex128", [11], 5]}), "dtype 'complex128'"),
    (_with_header(GOOD, a={**_header(GOOD)["a"], "logits": ["float32", [12], 5]}), "needs 48"),
    (_with_header(GOOD, a={**_header(GOOD)["a"], "logits": ["float32", [11], 9]}), "frame index 9"),
    (_with_header(GOOD, a={**_header(GOOD)["a"], "logits": ["float32", [11], 1]}), "missing or reused"),
    (_sampling(seed=None, top_k=None), "DecodeRequest.sampling: top_k: NoneType is not allowed"),
    (_sampling(temperature=-1.0), "DecodeRequest.sampling: temperature must be >= 0"),
    (_with_header(GOOD, f={**_header(GOOD)["f"], "sampling": {"top_k": 4}}),
     "sampling: missing fields ['frequency_penalty', 'grammar', 'logit_bias'"),
    (_with_header(GOOD, f={**_header(GOOD)["f"], "sampling": [4]}), "list is not a map of SamplingParams fields"),
    (GOOD[:-1], "frame index"),
    ([*GOOD, b"stray"], "not referenced"),
])
def test_malformed_frames_are_rejected(frames, needle):
    with pytest.raises(ProtocolError) as e:
        decode_frames([bytes(f) for f in frames])
    assert needle in str(e.value)
    if frames and len(frames[0]) > 4 and _readable(frames[0]):
        assert e.value.rid == "r3"          # the reply can name the request


def _readable(header: bytes) -> bool:
    try:
        return isinstance(msgpack.unpackb(header), dict)
    except Exception:
        return False


def test_every_message_with_a_state_names_its_kv_type():
    """VERSION 3 on: a state's KV cache type travels with it; a header without it is refused."""
    assert VERSION >= 3
    for cls in (DecodeRequest, PrefillRequest, Finished, Snapshot, Hello, Heartbeat):
        assert "kv_type" in {f.name for f in dataclasses.fields(cls)}, cls.__name__
    f = {k: v for k, v in _header(GOOD)["f"].items() if k != "kv_type"}
    with pytest.raises(ProtocolError, match=r"DecodeRequest: missing fields \['kv_type'\]"):
        decode_frames([bytes(x) for x in _with_header(GOOD, f=f)])
    assert decode_frames([bytes(x) for x in GOOD]).kv_type == "f16"


def test_sampling_travels_as_its_dataclass():
    back = decode_frames([bytes(f) for f in GOOD])
    assert type(back.sampling) is SamplingParams and back.sampling == SamplingParams(top_k=4)
    assert _header(GOOD)["f"]["sampling"] == dataclasses.asdict(SamplingParams(top_k=4))
    with pytest.raises(ProtocolError, match="DecodeRequest.sampling: dict is not allowed"):
        encode_message(dataclasses.replace(SAMPLES[-1], sampling={"top_k": 4}))


def test_encode_refuses_object_arrays():
    with pytest.raises(ProtocolError, match="cannot go on the wire"):
        encode_message(Finished("r", "w", "stop", 1, 1, 0, [np.array([object()])], [], [], np.ones(1, np.float32),
                                "f32"))


def test_inbox_survives_garbage_and_keeps_serving():
    errors = []
    inbox = PullQueue("tcp://127.0.0.1:0", name="test", on_error=errors.append)
    raw = open_socket(zmq.PUSH, inbox.address, bind=False)     # bytes as they are; one connection keeps order
    try:
        for frames in ([b"garbage"], _with_header(GOOD, v=99), GOOD[:-1], encode_message(SAMPLES[3])):
            raw.send_multipart([bytes(f) for f in frames])
        got = inbox.get(RECV_TIMEOUT_S)
        assert isinstance(got, DecodeStep) and got.seqs == [Tokens("r1", [5, 6, 7])]
        assert len(errors) == 3 and all(isinstance(e, ProtocolError) for e in errors)
    finally:
        raw.close()
        inbox.close()


def test_worker_answers_a_rejected_request_with_failed():
    router = PullQueue("tcp://127.0.0.1:0", name="router")
    link = WorkerLink("decode", router_address=router.address, inbox_address="tcp://127.0.0.1:0", advertise=None,
                      capacity=1, model="m", load=lambda: (0, 0))
    raw = open_socket(zmq.PUSH, link.address, bind=False)
    try:
        bad = _with_header(GOOD, a={**_header(GOOD)["a"], "logits": ["float32", [3], 5]})
        raw.send_multipart([bytes(f) for f in bad])
        reply = router.get(RECV_TIMEOUT_S)
        assert isinstance(reply, Failed) and reply.rid == "r3" and "needs 12" in reply.error
        assert link.get(0.1) is None        # nothing reached the service loop
    finally:
        raw.close()
        for q in (link, router):
            q.close()


def test_handshake_timeout_says_what_to_do():
    link = WorkerLink("prefill", router_address="tcp://127.0.0.1:9", inbox_address="tcp://127.0.0.1:0",
                      advertise=None, capacity=1, model="m", load=lambda: (0, 0))
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="Start `fermium router` first"):
            link.start(timeout=0.5)
        assert time.monotonic() - t0 < 3
    finally:
        link.close()


def test_wildcard_inbox_is_advertised_by_host_name():
    import socket

    from common.worker import reachable
    assert reachable("tcp://0.0.0.0:5561") == f"tcp://{socket.gethostname()}:5561"
    assert reachable("tcp://10.0.0.7:5561") == "tcp://10.0.0.7:5561"


# ---- hostile input: every failure is a ProtocolError, and nothing stops an inbox ----------------

def _field(**changes) -> list:
    return _with_header(GOOD, f={**_header(GOOD)["f"], **changes})


def _desc(**changes) -> list:
    return _with_header(GOOD, a={**_header(GOOD)["a"], **changes})


@pytest.mark.parametrize("frames", [
    [msgpack.packb({"v": VERSION, "k": [1], "f": {}, "a": {}})],     # an unhashable kind
    _desc(logits=["float32", [2 ** 32, 2 ** 32], 5]),                  # a shape whose product overflows int64
    _desc(logits=["float32", [2 ** 63], 5]),
    _desc(logits=5), _desc(state=5), _desc(state={"x": 1}), _desc(state=["float32", [6, 3], 1]),
    _desc(logits=[["float32"], [11], 5]), _desc(logits=["float32", [11], True]),
    _desc(logits=["float32", [1] * 9 + [11], 5]),
    _field(max_tokens=2 ** 64 - 1), _field(pos=2 ** 63), _field(history=[1, "x"]),
    _field(history=[1, [2]]), _field(stop_ids=[True]), _field(sampling={"a": {"b": [1]}}),
    _field(sampling={"t": float("inf")}), _field(sampling={"top_k": 2 ** 64 - 1}),
    [GOOD[0], 7, *GOOD[2:]], [3], "frames", [b"\x93" * 2000], [b"\xdd\xff\xff\xff\xff"],
])
def test_any_undecodable_input_is_a_protocol_error(frames):
    with pytest.raises(ProtocolError):
        decode_frames(frames if isinstance(frames, str) else [f if isinstance(f, int) else bytes(f) for f in frames])


def test_encode_refuses_integers_beyond_int64():
    for msg in (DecodeRequest("r", 0, [2 ** 63], SamplingParams(), 1, [], False, [], None, "f16"),
                DecodeRequest("r", 0, [], SamplingParams(top_k=2 ** 64), 1, [], False, [], None, "f16"),
                DecodeStep("", "w", [Tokens("r", [1, 2 ** 70])])):
        with pytest.raises(ProtocolError, match="int64"):
            encode_message(msg)


def test_limits_refuse_too_many_frames_and_bytes():
    from common.protocol.codec import WireLimits
    for limits in (WireLimits(1 << 20, 1 << 20, len(GOOD) - 1), WireLimits(1 << 20, 100, len(GOOD))):
        with pytest.raises(ProtocolError) as e:
            decode_frames([bytes(f) for f in GOOD], limits)
        assert e.value.reason == "too_large"


def test_inbox_counts_and_survives_a_failing_handler_and_error_handler():
    counted, got = [], []

    def handle(msg):
        if msg.rid == "boom":
            raise RuntimeError("handler bug")
        got.append(msg)

    def on_error(err):
        raise RuntimeError("error handler bug")

    inbox = PullQueue("tcp://127.0.0.1:0", name="test", on_message=handle, on_error=on_error, errors=counted.append)
    raw = open_socket(zmq.PUSH, inbox.address, bind=False)
    try:
        for frames in (encode_message(Cancel("boom", "")), [b"\x81\xa1k\x91\x01"],
                       [msgpack.packb({"v": VERSION, "k": [1]})],
                       encode_message(Cancel("fine", ""))):
            raw.send_multipart([bytes(f) for f in frames])
        deadline = time.monotonic() + RECV_TIMEOUT_S
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [m.rid for m in got] == ["fine"]
        assert sorted(counted) == ["decode", "decode", "handler", "handler", "handler"]
    finally:
        raw.close()
        inbox.close(wait=1)


def test_a_frame_over_maxmsgsize_is_dropped_by_zeromq_and_the_inbox_goes_on():
    from common.protocol.codec import WireLimits
    counted = []
    inbox = PullQueue("tcp://127.0.0.1:0", name="test", limits=WireLimits(1 << 16, 1 << 17, 4), errors=counted.append)
    big, small = open_socket(zmq.PUSH, inbox.address, bind=False), open_socket(zmq.PUSH, inbox.address, bind=False)
    try:
        time.sleep(0.1)
        big.send_multipart([encode_message(Cancel("big", ""))[0], b"\0" * (64 << 20)])
        small.send_multipart([encode_message(Cancel("parts", ""))[0], *[b"\0" * 60_000] * 3])
        small.send_multipart(encode_message(Cancel("small", "")))
        assert inbox.get(RECV_TIMEOUT_S).rid == "small"
        assert inbox.get(0.3) is None
        assert counted == ["too_large"]     # the big frame never reached Python; parts under MAXMSGSIZE did
    finally:
        big.close()
        small.close()
        inbox.close(wait=1)
