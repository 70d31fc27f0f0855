"""The shared snapshot tier on a real redis-server: two stores (two routers) see each other's
snapshots with the local tiers' results, KV blocks are stored once, damage is dropped, and a
store that is down or slow fails nothing and is reconnected; then two real routers share one."""
from __future__ import annotations

import threading
import time

import httpx
import msgpack
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.snapshots import SnapshotStore
from common.snapshots import redis_tier as rt
from common.snapshots.keys import ROOT, tail_key
from common.snapshots.redis_trust import derive_key
from common.state import SequenceState
from tests.redis_helpers import RedisServer, needs_redis
from tests.test_snapshot_store import BLOCK, CFG, assert_same, put, state_after
from tests.up_helpers import wait_healthy

pytestmark = needs_redis
KEY = derive_key("the deployment's secret")


class Events:
    def __init__(self):
        self.counts: dict[str, int] = {}

    def __call__(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path).start()
    yield s
    s.kill()


def router_store(url: str, events=None, **kw) -> SnapshotStore:
    tier = rt.RedisTier(url, CFG, "f32", BLOCK, "test-model", events or Events(), key=KEY, **kw)
    return SnapshotStore(CFG, budget_bytes=1 << 30, block=BLOCK, shared=tier)


def heads(r, ns: str, kind: str) -> list[bytes]:
    """The head keys of one kind (not their chunks)."""
    return [k for k in r.keys(f"{ns}{kind}:*") if k.count(b":") == ns.count(":") + 1]


def logits_of(tokens) -> np.ndarray:
    return np.full(CFG.vocab_size, len(tokens), np.float32)


def test_a_snapshot_of_one_router_is_a_hit_on_another(server):
    a, b = router_store(server.url), router_store(server.url)
    tokens = list(range(1, 22))                                # 2 full blocks and a tail of 5
    put(a, tokens)
    assert a.shared.flush(5)
    query = tokens + [40, 41, 42]
    assert b.lookup(query) is None                             # nothing in B's RAM before the prefetch
    assert b.prefetch(query) == len(tokens)
    state, logits = b.lookup(query)
    assert_same(state, state_after(tokens))
    np.testing.assert_array_equal(logits, logits_of(tokens))
    assert b.prefetch(query) == 0                              # RAM holds it now: nothing fetched


def test_kv_blocks_are_stored_once_and_reused(server):
    a, b = router_store(server.url), router_store(server.url)
    base = list(range(1, 17))                                  # two full blocks
    put(a, base + [30, 31])
    put(a, base + [32, 33, 34])
    assert a.shared.flush(5)
    r = server.client()
    ns = rt.namespace("test-model", "f32")
    assert len(heads(r, ns, "blk")) == 2 and len(heads(r, ns, "snap")) == 2
    assert b.prefetch(base + [30, 31, 5]) == 18
    fetched = []
    original = b.shared._read_block
    b.shared._read_block = lambda *args: fetched.append(args[0]) or original(*args)
    assert b.prefetch(base + [32, 33, 34, 9]) == 19
    assert fetched == []                                       # its blocks were in B's RAM already
    assert_same(b.lookup(base + [32, 33, 34])[0], state_after(base + [32, 33, 34]))


def test_the_blob_is_chunked(server, monkeypatch):
    monkeypatch.setattr(rt, "CHUNK", 100)
    a, b = router_store(server.url), router_store(server.url)
    tokens = list(range(1, 12))
    put(a, tokens)
    assert a.shared.flush(5)
    chunks = server.client().keys(f"{rt.namespace('test-model', 'f32')}snap:*:*:*")
    assert len(chunks) > 3 and all(len(server.client().get(c)) <= 100 for c in chunks)
    assert b.prefetch(tokens) == len(tokens)
    assert_same(b.lookup(tokens)[0], state_after(tokens))


def test_a_damaged_or_evicted_blob_is_a_miss_of_that_snapshot(server):
    a, b = router_store(server.url), router_store(server.url)
    short, long = list(range(1, 12)), list(range(1, 20))
    put(a, short)
    put(a, long)
    assert a.shared.flush(5)
    r, ns = server.client(), rt.namespace("test-model", "f32")
    long_key = a._longest(long, ())
    chunk = r.keys(f"{ns}snap:{long_key.hex()}:*")[0]
    value = bytearray(r.get(chunk))
    value[-1] ^= 0xFF
    r.set(chunk, bytes(value))
    assert b.prefetch(long) == len(short)                      # the damaged one is dropped, the next shorter serves
    assert r.get(f"{ns}snap:{long_key.hex()}") is None
    assert_same(b.lookup(long)[0], state_after(short))
    short_key = a._longest(short, ())
    r.set(f"{ns}snap:{short_key.hex()}", msgpack.packb(["x", 1 << 40, 1 << 62]))   # a head that asks for too much
    assert router_store(server.url).prefetch(long) == 0
    assert r.get(f"{ns}snap:{short_key.hex()}") is None
    c = router_store(server.url)
    for key in heads(r, ns, "blk"):
        r.delete(key)                                          # as allkeys-lru may
    assert c.prefetch(long) == 0 and c.lookup(long) is None


def test_a_store_that_is_down_fails_nothing_and_is_reconnected(server):
    events = Events()
    a = router_store(server.url, events, timeout=0.3)
    server.kill()
    tokens = list(range(1, 12))
    put(a, tokens)                                             # RAM holds it; the write is dropped
    assert a.shared.flush(5)
    assert events["fallback_store"] == 1 and events["down"] == 1
    t0 = time.monotonic()
    assert a.prefetch(tokens + [1]) == 0                       # in its backoff: skipped at once
    assert time.monotonic() - t0 < 0.1
    assert events["fallback_lookup"] == 1
    assert_same(a.lookup(tokens)[0], state_after(tokens))
    server.start()
    deadline = time.monotonic() + 10
    while not events["reconnect"] and time.monotonic() < deadline:
        time.sleep(0.05)                                       # nothing calls it: the writer's probe sees it back
    assert events["reconnect"] == 1 and events["up"] >= 1
    put(a, tokens + [3, 4])
    assert a.shared.flush(5) and events["write"] == 1


def test_a_slow_store_times_out(tmp_path):
    """A server that accepts and never answers: every call ends within its timeout."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass
    threading.Thread(target=accept, daemon=True).start()
    events = Events()
    try:
        a = router_store(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", events, timeout=0.3)
        t0 = time.monotonic()
        assert a.prefetch(list(range(1, 12))) == 0
        assert time.monotonic() - t0 < 1.0
        assert events["fallback_lookup"] == 1
    finally:
        stop.set()
        listener.close()
        for s in held:
            s.close()


def test_a_pos_zero_record_round_trips(server):
    """The bench's shape: a state with no KV at all, fetched from beyond=-1."""
    tier = rt.RedisTier(server.url, CFG, "f32", BLOCK, "test-model", key=KEY)
    s = SequenceState.empty(CFG)
    s.ssm = [np.random.default_rng(1).standard_normal(a.shape).astype(np.float32) for a in s.ssm]
    key = tail_key(ROOT, [])
    tier.put(rt.Record(key, 0, ROOT, [], [*s.conv, *s.ssm], logits_of([]), s.k, s.v, 0, {}))
    assert tier.flush(5)
    got = tier.fetch([], (), -1)
    assert got is not None and got.pos == 0
    for x, y in zip(got.recurrent, [*s.conv, *s.ssm]):
        np.testing.assert_array_equal(x, y)


# ---- two real routers, each with its own prefill and decode, on one redis-server

READY_TIMEOUT_S = 90
MAX_TOKENS = 8
PREFILLED = "fermium_prefill_tokens_total"
SAVED = "fermium_snapshot_tokens_saved_total"


@pytest.fixture(scope="module")
def demo():
    from tests.stack_helpers import DemoReference
    ref = DemoReference()
    return ref.tok, lambda ids, n=MAX_TOKENS: ref.cold(ids, n), ref.corpus


def test_turn_two_on_another_router_prefills_only_its_new_tokens(tmp_path, demo):
    from tests.shared_stacks import complete, metric, routers, wait_written
    tok, cold, corpus = demo
    with RedisServer(tmp_path).start() as server, routers(tmp_path, server.url, 2) as (a, b):
        turn1 = corpus[:150]
        generated = cold(turn1)
        assert complete(a, turn1, MAX_TOKENS) == tok.decode([t for t in generated if t not in tok.eos_ids])
        wait_written(a)
        turn2 = turn1 + generated[:-1] + corpus[300:310]     # the last token was never fed: it is not in the state
        saved, prefilled = metric(b, "router", SAVED), metric(b, "prefill", PREFILLED)
        text = complete(b, turn2, MAX_TOKENS)
        assert metric(b, "prefill", PREFILLED) - prefilled == 10
        assert metric(b, "router", SAVED) - saved == len(turn1) + len(generated) - 1
        assert metric(b, "router", "fermium_snapshot_store_hits_total") == 1
        assert text == tok.decode([t for t in cold(turn2) if t not in tok.eos_ids])


def test_redis_killed_and_started_again_under_load_fails_nothing(tmp_path, demo):
    from tests.shared_stacks import Load, metric, routers
    _, _, corpus = demo
    redis_server = RedisServer(tmp_path).start()
    try:
        with routers(tmp_path, redis_server.url, 2) as stacks:
            with Load(stacks, corpus, clients=2) as load:
                load.wait_for(4)
                redis_server.kill()
                load.wait_for(load.done + 4)
                redis_server.start()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not all(
                        metric(s, "router", "fermium_snapshot_store_reconnects_total") for s in stacks):
                    time.sleep(0.2)
                load.wait_for(load.done + 4)
            assert load.failed == [] and load.done >= 12
            for s in stacks:
                text = httpx.get(f"http://127.0.0.1:{s.metrics_ports['router']}/metrics", timeout=5).text
                fallbacks = {x.labels["op"]: x.value for f in text_string_to_metric_families(text) for x in f.samples
                             if x.name == "fermium_snapshot_store_fallbacks_total"}
                assert fallbacks["lookup"] >= 1 and fallbacks["store"] >= 1, fallbacks
                assert metric(s, "router", "fermium_snapshot_store_reconnects_total") >= 1
                assert metric(s, "router", "fermium_snapshot_store_up") == 1
    finally:
        redis_server.kill()


def test_fermium_up_takes_the_store(tmp_path, demo):
    """Two `fermium up` stacks on one store: the second serves the first one's prompt from it."""
    import signal
    import subprocess
    import sys

    from common.model.default import default_model_path
    from fermium.stack import free_port
    from tests.shared_stacks import complete
    _, _, corpus = demo
    with RedisServer(tmp_path).start() as server:
        ups = []
        try:
            for i in range(2):
                port, metrics = free_port(), free_port()
                argv = [sys.executable, "-m", "fermium", "up", "--model", str(default_model_path()), "--port",
                        str(port), "--runner", "reference", "--metrics-port", str(metrics),
                        "--snapshot-store", server.url, "--snapshot-key", "one key for both"]
                err = open(tmp_path / f"up{i}.err", "wb")
                ups.append((subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True),
                            f"http://127.0.0.1:{port}", metrics))
            for i, (proc, url, _) in enumerate(ups):
                wait_healthy(url, proc, READY_TIMEOUT_S, lambda: (tmp_path / f"up{i}.err").read_text()[-2000:],
                             "fermium up")

            def router_metric(metrics: int, name: str) -> float:
                text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
                return sum(x.value for f in text_string_to_metric_families(text) for x in f.samples if x.name == name)
            prompt = corpus[:100]
            first = complete(ups[0][1], prompt, MAX_TOKENS)
            deadline = time.monotonic() + 30
            while router_metric(ups[0][2], "fermium_snapshot_store_queue") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert router_metric(ups[0][2], "fermium_snapshot_store_writes_total") >= 1
            assert complete(ups[1][1], prompt, MAX_TOKENS) == first
            assert router_metric(ups[1][2], "fermium_snapshot_store_hits_total") == 1
            assert router_metric(ups[1][2], SAVED) == len(prompt)
        finally:
            for proc, _, _ in ups:
                proc.send_signal(signal.SIGTERM)
            for proc, _, _ in ups:
                proc.wait(30)


def test_the_store_password_stays_out_of_logs():
    from common.snapshots.redis_link import redacted
    assert redacted("redis://:s3cret@10.0.0.1:6379/0") == "redis://:***@10.0.0.1:6379/0"
    assert redacted("redis://user:s3cret@store/1") == "redis://user:***@store/1"
    assert redacted("redis://10.0.0.1:6379/0") == "redis://10.0.0.1:6379/0"
