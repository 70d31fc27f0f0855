"""Hostile frames: seeded random and mutated multipart messages to every inbox of a real stack
(the router's worker inbox, a prefill and a decode worker's), then proof that each service still
serves the same answer, that every process lives, and that none grew by more than RSS_GROWTH_MB
over the second of two floods (nor by more than FIRST_FLOOD_MB over the first).

The messages start from real encoded messages of every kind, with states of the model's true
shapes, and mutate their headers (kinds, versions, field types, huge ints, shapes, dtypes,
descriptors, frame indices), their frames (missing, extra, truncated, refolded with the same
byte count) or are plain random bytes; one frame per inbox is larger than its MAXMSGSIZE.
A mutation may leave a message valid: a DecodeRequest or PrefillRequest then really runs, so
their max_tokens stay small, and they name rids the router never issued.
"""
from __future__ import annotations

import dataclasses
import time

import httpx
import msgpack
import numpy as np
import openai
import pytest
import zmq

from common.model.gguf_file import GGUFModel
from common.mp import open_socket
from common.protocol import ProtocolError, decode_frames, encode_message
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import PrefillRequest
from common.protocol.router import DecodeStep, Failed, Finished, Heartbeat, Hello, PrefillDone, Snapshot, Tokens
from common.protocol.worker import Cancel, HelloAck
from common.sampling import SamplingParams
from common.state import SequenceState
from fermium.stack import Stack, free_port
from tests.stack_helpers import write_tiny_gguf

N_PER_INBOX = 10_000
WARMUP = 1_000             # messages per inbox (and an oversize frame) before the RSS baseline, so the
                           # first use of each path (rejections, the runner's batch buffers) is not growth
FLOODS = 2                 # a leak grows with every flood; the allocator's high-water mark with the first
RSS_GROWTH_MB = 20         # over the second flood
FIRST_FLOOD_MB = 40        # over the first, high-water marks of its bursts included
SEED = 27
READY_TIMEOUT_S = 60
DRAIN_QUIET_S = 1.5        # the error counters stood still this long: the inbox is drained
NOWHERE = "tcp://127.0.0.1:9"
HOSTILE_VALUES = [2 ** 63, 2 ** 64 - 1, -2 ** 63, -1, 0, 1, 10 ** 6, float("nan"), float("inf"), -0.0, 1e308,
                  "", "x" * 300, b"\xff\xfe", None, True, [], [2 ** 63], [-1], ["a"], [[1]], [1.5], {},
                  {"a": {"b": 1}}, {"temperature": -1.0}, {"top_k": 2 ** 63}, {"nope": 1}, {1.5: 2}]
HOSTILE_DESCS = [5, "float32", None, [], {}, ["float32"], [["float32", [1], 1]], ["float32", 3, 1],
                 ["complex64", [1], 1], [["f"], [1], 1], [3, [1], 1], ["float32", [2 ** 32, 2 ** 32], 1],
                 ["float32", [-1], 1], ["float32", [2 ** 63], 1], ["float32", [1] * 40, 1], ["float32", [1], 0],
                 ["float32", [1], -1], ["float32", [1], 99], ["float32", [1], True], ["float32", [1], "1"]]


def make(cls, **values):
    """A message of `cls` from `values`; fields another version added get a plain value of their type."""
    plain = {"str": "x", "int": 0, "bool": False, "float": 0.0, "list[int]": [], "list[float]": []}
    return cls(**{f.name: values.get(f.name, plain.get(str(f.type).split(" ")[0])) for f in dataclasses.fields(cls)})


def state_at(cfg, pos: int) -> list[np.ndarray]:
    s = SequenceState.empty(cfg)
    s.k = [np.full((pos, cfg.n_kv_heads, cfg.head_dim), 0.1, np.float32) for _ in s.k]
    s.v = [np.full((pos, cfg.n_kv_heads, cfg.head_dim), 0.1, np.float32) for _ in s.v]
    return s.arrays()


def samples(cfg, decode_address: str) -> list[list[bytes]]:
    """Real encoded messages of every kind, with states the model accepts."""
    logits = np.linspace(-1, 1, cfg.vocab_size, dtype=np.float32)
    n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
    msgs = [
        make(DecodeRequest, rid="h-dec", pos=3, history=[72, 101, 108], sampling=SamplingParams(temperature=0.0),
             max_tokens=2, stop_ids=[0], return_state=True, state=state_at(cfg, 3), logits=logits),
        make(PrefillRequest, rid="h-pre", tokens=[108, 111], history=[72, 101, 108, 111], start_pos=2,
             decode_address=decode_address, sampling=SamplingParams(), max_tokens=1, stop_ids=[], return_state=False,
             start_state=state_at(cfg, 2), snapshot_every=2),
        make(PrefillRequest, rid="h-pre0", tokens=[72, 105], history=[72, 105], start_pos=0,
             decode_address=decode_address, sampling=SamplingParams(top_k=3, seed=1, temperature=0.7), max_tokens=1,
             stop_ids=[3], return_state=False, start_state=None, snapshot_every=0),
        make(DecodeStep, rid="", worker_id="decode-x", seqs=[Tokens("h-tok", [1, 2]), Tokens("h-tok2", [3], [-0.5])]),
        make(Finished, rid="h-fin", worker_id="decode-x", reason="stop", n_generated=1, pos=3, since=1,
             recurrent=state_at(cfg, 2)[:2 * n_lin], k=state_at(cfg, 2)[2 * n_lin:][:n_full],
             v=state_at(cfg, 2)[2 * n_lin:][n_full:], logits=logits),
        make(Finished, rid="h-fin0", worker_id="decode-x", reason="stop", n_generated=1, pos=3, since=0,
             recurrent=state_at(cfg, 3)[:2 * n_lin], k=state_at(cfg, 3)[2 * n_lin:][:n_full],
             v=state_at(cfg, 3)[2 * n_lin:][n_full:], logits=logits),
        make(Snapshot, rid="h-snap", worker_id="prefill-x", pos=3, since=1, recurrent=state_at(cfg, 2)[:2 * n_lin],
             k=state_at(cfg, 2)[2 * n_lin:][:n_full], v=state_at(cfg, 2)[2 * n_lin:][n_full:], logits=logits),
        make(PrefillDone, rid="h-done", worker_id="prefill-x", n_tokens=2, seconds=0.1),
        make(Failed, rid="h-fail", worker_id="prefill-x", error="boom"),
        make(Hello, rid="h-hello", worker_id="fake", role="decode", address=NOWHERE, capacity=1, model="m"),
        make(Heartbeat, rid="h-beat", worker_id="fake", role="decode", address=NOWHERE, capacity=1, model="m",
             running=0, waiting=0),
        make(HelloAck, rid="h-ack", worker_id="fake", accepted=False, reason="no"),
        make(Cancel, rid="h-cancel", reason="x"),
    ]
    return [[bytes(f) for f in encode_message(m)] for m in msgs] + bad_steps() + bad_finishes(cfg)


def bad_steps() -> list[list[bytes]]:
    """DecodeSteps that no encoder makes and the codec refuses whole: misaligned logprobs, a
    sequence twice, one entry too many."""
    from common.protocol.router import MAX_STEP_SEQUENCES
    entry = {"rid": "h-tok", "tokens": [1, 2], "logprobs": [], "top_ids": [], "top_logprobs": []}
    header = msgpack.unpackb(encode_message(DecodeStep("", "decode-x", [Tokens("h-tok", [1])]))[0])
    many = [{**entry, "rid": f"h{i}"} for i in range(MAX_STEP_SEQUENCES + 1)]
    return [[msgpack.packb({**header, "f": {**header["f"], "seqs": seqs}})]
            for seqs in ([{**entry, "logprobs": [-0.5]}], [entry, entry], many)]


def bad_finishes(cfg) -> list[list[bytes]]:
    """Finished messages that no encoder makes and the codec refuses whole: KV rows from past its
    position, rows that do not add up to [since, pos), K and V of different counts, a state
    without its logits."""
    n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
    arrays = state_at(cfg, 2)
    good = [bytes(f) for f in encode_message(Finished("h-fin", "decode-x", "stop", 1, 3, 1, arrays[:2 * n_lin],
                                                      arrays[2 * n_lin:][:n_full], arrays[2 * n_lin:][n_full:],
                                                      np.zeros(cfg.vocab_size, np.float32), "f32"))]
    header = msgpack.unpackb(good[0])

    def bad(frames=good[1:], **changes):
        return [msgpack.packb({**header, "f": {**header["f"], **changes.get("f", {})},
                               "a": {**header["a"], **changes.get("a", {})}}), *frames]
    return [bad(f={"since": 4}), bad(f={"pos": 4}), bad(f={"since": 2}),
            bad(a={"k": header["a"]["k"] + header["a"]["v"][:1], "v": header["a"]["v"][1:]}),
            bad(good[1:-1], a={"logits": None})]


def test_the_bad_finishes_are_refused(tmp_path):
    cfg = GGUFModel(str(write_tiny_gguf(tmp_path / "tiny.gguf"))).config
    words = ("do not end at 3", "are not 3 rows", "are not 1 rows", "K and", "come together")
    for frames, said in zip(bad_finishes(cfg), words, strict=True):
        with pytest.raises(ProtocolError, match=said) as e:
            decode_frames(frames)
        assert e.value.rids == ("h-fin",)


def test_the_bad_steps_are_refused():
    for frames, words in zip(bad_steps(), ("aligned", "two entries", "at most")):
        with pytest.raises(ProtocolError, match=words):
            decode_frames(frames)


class Hostile:
    """A seeded stream of mutated and random multipart messages."""

    def __init__(self, seed: int, base: list[list[bytes]]):
        self.rng, self.base = np.random.default_rng(seed), base

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def bytes(self, n: int) -> bytes:
        return self.rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    def __call__(self) -> list[bytes]:
        frames = list(self.pick(self.base))
        header = msgpack.unpackb(frames[0])
        op = int(self.rng.integers(12))
        if op == 0:                                            # random bytes, one or more frames
            return [self.bytes(int(self.rng.integers(0, 200))) for _ in range(int(self.rng.integers(1, 4)))]
        if op == 1:                                            # a truncated header
            return [frames[0][:int(self.rng.integers(len(frames[0])))], *frames[1:]]
        if op == 2:                                            # flipped header bytes
            h = bytearray(frames[0])
            for i in self.rng.integers(0, len(h), int(self.rng.integers(1, 6))):
                h[i] = int(self.rng.integers(256))
            return [bytes(h), *frames[1:]]
        if op == 3:
            header["k"] = self.pick([0x30, 0x20, 0x10, 0x14, 0x01, 0xFF, -1, "k", [1], None, 2 ** 64 - 1, 1.5])
        elif op == 4:
            header["v"] = self.pick([0, 2, -1, "1", None, [1], 2 ** 64 - 1])
        elif op in (5, 6) and header["f"]:                     # a field's value, or its absence
            name = self.pick(sorted(header["f"]))
            if op == 5:
                header["f"][name] = self.pick(HOSTILE_VALUES)
            else:
                del header["f"][name]
        elif op == 7:
            header["f"][self.pick(["extra", "rid", "tokens"])] = self.pick(HOSTILE_VALUES)
        elif op in (8, 9) and frames[1:]:                      # descriptors: replaced, or refolded
            name = self.pick([n for n, d in header["a"].items() if d])
            single = isinstance(header["a"][name][0], str)
            i = 0 if single else int(self.rng.integers(len(header["a"][name])))
            one = header["a"][name] if single else header["a"][name][i]
            if op == 8:
                new = self.pick(HOSTILE_DESCS) if self.rng.random() < 0.5 else [one[0], one[1], 1]
            else:                                              # the same bytes, another shape
                size = int(np.prod(one[1]))
                new = [one[0], self.pick([[size], [1, size], [size, 1], [1, 1, size], one[1][::-1]]), one[2]]
            if single:
                header["a"][name] = new
            else:
                header["a"][name][i] = new
            return [msgpack.packb(header), *frames[1:]]
        elif op == 10:                                         # frames missing, extra or cut short
            cut = [f[:len(f) // 2] for f in frames[1:]] if self.rng.random() < 0.5 else frames[1:-1]
            return [frames[0], *cut] if self.rng.random() < 0.7 else [*frames, self.bytes(16)]
        else:                                                  # array bytes replaced: shapes fine, values not
            return [frames[0], *[self.bytes(len(f)) for f in frames[1:]]]
        return [msgpack.packb(header), *frames[1:]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    model = write_tiny_gguf(root / "tiny.gguf")
    ports = {"router": free_port(), "prefill": free_port(), "decode": free_port()}
    with Stack(str(model), port=free_port(), metrics_ports=ports, log_dir=root) as s:
        s.wait_ready(READY_TIMEOUT_S)
        s.metrics_ports, s.cfg = ports, GGUFModel(str(model)).config
        yield s


def completion(stack) -> str:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    return client.completions.create(model="fermium", prompt="the cat", max_tokens=8, temperature=0).choices[0].text


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def protocol_errors(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("fermium_protocol_errors_total{"))


def wait_drained(stack) -> dict[str, float]:
    last, quiet_since = None, time.monotonic()
    while True:
        now = {name: protocol_errors(port) for name, port in stack.metrics_ports.items()}
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since > DRAIN_QUIET_S:
            return now
        time.sleep(0.2)


def flood(address: str, gen: Hostile, n: int) -> None:
    sock = open_socket(zmq.PUSH, address, bind=False)
    try:
        for _ in range(n):
            frames = gen()
            while True:
                try:
                    sock.send_multipart(frames, flags=zmq.NOBLOCK)
                    break
                except zmq.Again:                              # the inbox's high-water mark: let it catch up
                    time.sleep(0.001)
    finally:
        sock.setsockopt(zmq.LINGER, 30_000)                    # what is still queued here goes out
        sock.close()


def oversize(address: str) -> None:
    sock = open_socket(zmq.PUSH, address, bind=False)
    try:
        sock.send_multipart([encode_message(Cancel("h-big", ""))[0], b"\0" * (64 << 20)])
        time.sleep(0.3)                                        # LINGER=0: give it time to leave
    finally:
        sock.close()


def test_every_inbox_survives_a_flood_of_hostile_frames(stack):
    before = completion(stack)
    workers = stack.health()["workers"]
    inboxes = {"router": stack.workers, **{w["role"]: w["address"] for w in workers}}
    gens = {name: Hostile(SEED + i, samples(stack.cfg, inboxes["decode"])) for i, name in enumerate(inboxes)}
    for name, address in inboxes.items():
        oversize(address)
        flood(address, gens[name], WARMUP)
    start_errors = wait_drained(stack)
    assert completion(stack) == before
    rss = [{name: rss_mb(p.pid) for name, p in stack.procs.items()}]

    t0 = time.monotonic()
    for _ in range(FLOODS):
        for name, address in inboxes.items():
            oversize(address)
            flood(address, gens[name], N_PER_INBOX)
        errors = wait_drained(stack)
        rss.append({name: rss_mb(p.pid) for name, p in stack.procs.items()})
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + 10                           # fake workers, if any registered, are reaped
    while {w["id"] for w in stack.health()["workers"]} - {w["id"] for w in workers} and time.monotonic() < deadline:
        time.sleep(0.2)

    assert all(p.poll() is None for p in stack.procs.values()), "a process died"
    assert {w["id"] for w in workers} <= {w["id"] for w in stack.health()["workers"]}
    assert completion(stack) == before
    first = {name: rss[1][name] - rss[0][name] for name in rss[0]}
    grown = {name: rss[-1][name] - rss[1][name] for name in rss[0]}
    print(f"\nhostile frames: {FLOODS} x {N_PER_INBOX} per inbox (+{WARMUP} warm-up) in {seconds:.1f} s; "
          f"protocol errors counted: {({k: int(errors[k] - start_errors[k]) for k in errors})}; "
          f"RSS growth MB over the first flood: {({k: round(v, 1) for k, v in first.items()})}, "
          f"over the second: {({k: round(v, 1) for k, v in grown.items()})}")
    assert all(errors[k] > start_errors[k] for k in errors), "the floods were not counted"
    assert max(first.values()) < FIRST_FLOOD_MB, first
    assert max(grown.values()) < RSS_GROWTH_MB, grown
