"""The shared snapshot tier does not trust Redis (common/snapshots/redis_trust.py): a forged blob,
re-packed with fresh (unkeyed) checksums, or a genuine one moved under another key, is dropped
and counted, and the lookup falls back to what this deployment wrote; a flooded index neither
changes a lookup's answer nor slows it past 2x; a rediss:// store is reached over TLS, checked
against its CA; and two real routers answer as a cold run does with a forged prefix in the store."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import PurePosixPath

import numpy as np
import pytest

from common.snapshots import SnapshotStore, disk
from common.snapshots import redis_tier as rt
from common.snapshots.keys import chain, prefix_key
from common.snapshots.redis_trust import derive_key
from services.router.engine.shared_store import StoreAddressError, check_store_url
from tests.redis_helpers import RedisServer, needs_redis
from tests.test_shared_snapshots import KEY, Events, router_store
from tests.test_snapshot_store import BLOCK, CFG, assert_same, put, state_after

pytestmark = needs_redis
NS = rt.namespace("test-model", "f32")
JUNK = 200_000                  # junk index members, as the attack that was seen
TIMED = 21                      # lookups timed with and without the junk


@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path).start()
    yield s
    s.kill()


def forge(r, head: str, tokens: list[int], signed_with: bytes | None) -> None:
    """Replace the blob of `head` with the state after `tokens`, re-packed with fresh checksums:
    unsigned (the format before MACs), or signed with a key of another deployment."""
    other = state_after(tokens)
    header, _ = disk.parse(PurePosixPath(head.replace(":", "/")), _blob(r, head))
    prefix, views = disk.pack(header["pos"], bytes.fromhex(header["key"]),
                              [*other.conv, *other.ssm, np.full(CFG.vocab_size, 99, np.float32),
                               *[k[len(header["meta"]["blocks"]) * BLOCK:] for k in other.k],
                               *[v[len(header["meta"]["blocks"]) * BLOCK:] for v in other.v]], header["meta"])
    data = b"".join([prefix, *views])
    nonce = os.urandom(6).hex()
    r.set(f"{head}:{nonce}:0", data)
    if signed_with is None:
        import msgpack
        r.set(head, msgpack.packb([nonce, 1, len(data)]))
    else:
        signer = rt.Signer(signed_with)
        r.set(head, signer.head(head, nonce, 1, len(data), signer.mac(head, b"blob", data)))


def _blob(r, head: str) -> bytes:
    nonce, n, _, _ = rt.Signer(KEY).open_head(head, r.get(head))
    return b"".join(r.get(f"{head}:{nonce}:{i}") for i in range(n))


@pytest.mark.parametrize("signed_with", [None, derive_key("another deployment")], ids=["unsigned", "other-key"])
def test_a_forged_blob_is_dropped_counted_and_never_used(server, signed_with):
    a, events = router_store(server.url), Events()
    short, long = list(range(1, 12)), list(range(1, 20))
    put(a, short)
    put(a, long)
    assert a.shared.flush(5)
    r, head = server.client(), f"{NS}snap:{prefix_key(long, BLOCK).hex()}"
    forge(r, head, [7] * len(long), signed_with)
    b = router_store(server.url, events)
    assert b.prefetch(long) == len(short)                     # the forgery is refused; the genuine shorter one serves
    assert events["rejected"] == 1 and r.get(head) is None
    assert_same(b.lookup(long)[0], state_after(short))


def test_the_same_forgery_signed_with_the_key_would_be_used(server):
    """The check that the MAC is what stops a forgery: signed with this deployment's key, it is taken."""
    a = router_store(server.url)
    long = list(range(1, 20))
    put(a, long)
    assert a.shared.flush(5)
    forge(server.client(), f"{NS}snap:{prefix_key(long, BLOCK).hex()}", [7] * len(long), KEY)
    b = router_store(server.url)
    assert b.prefetch(long) == len(long)
    assert b.lookup(long)[1][0] == 99                          # the forged logits


def test_a_genuine_entry_moved_under_another_key_is_dropped(server):
    a, events = router_store(server.url), Events()
    one, two = list(range(1, 12)), list(range(1, 11)) + [40]
    put(a, one)
    put(a, two)
    assert a.shared.flush(5)
    r = server.client()
    h1, h2 = (f"{NS}snap:{prefix_key(t, BLOCK).hex()}" for t in (one, two))
    nonce = rt.Signer(KEY).open_head(h1, r.get(h1))[0]
    r.set(f"{h2}:{nonce}:0", r.get(f"{h1}:{nonce}:0"))
    r.set(h2, r.get(h1))                                       # one's head and blob, under two's key
    b = router_store(server.url, events)
    assert b.prefetch(two) == 0
    assert events["rejected"] == 1 and b.lookup(two) is None


def _timed_prefetch(url: str, model: str, query: list[int], want: list[int]) -> float:
    b = SnapshotStore(CFG, 1 << 30, block=BLOCK, shared=rt.RedisTier(url, CFG, "f32", BLOCK, model, key=KEY))
    t0 = time.perf_counter()
    got = b.prefetch(query)
    took = time.perf_counter() - t0
    assert got == len(want)
    assert_same(b.lookup(query)[0], state_after(want))
    return took


def test_a_junk_flooded_index_changes_no_answer_and_slows_no_lookup(server):
    """The same snapshot in two namespaces, one of them flooded; their lookups are timed in
    turn, so that the load of a shared machine falls on both alike."""
    genuine = list(range(1, 20))
    query = genuine + [50, 51, 52, 53, 54]
    for model in ("clean-model", "test-model"):
        a = SnapshotStore(CFG, 1 << 30, block=BLOCK,
                          shared=rt.RedisTier(server.url, CFG, "f32", BLOCK, model, key=KEY))
        put(a, genuine)
        assert a.shared.flush(5)
    r = server.client()
    bases = [b"\0" * 16, *chain(query, BLOCK)]
    for base in bases:                                         # the old set index, as the attack filled it
        members = [f"junk{i}" for i in range(JUNK // len(bases))]
        for lo in range(0, len(members), 20_000):
            r.sadd(f"{NS}tails:{base.hex()}", *members[lo:lo + 20_000])
        bits = f"{NS}tailbits:{base.hex()}"
        r.setrange(bits, 0, b"\xff" * (JUNK // 8 // len(bases)))  # every tail length marked, and far past them
    r.sadd(f"{NS}tailbits:junk", *range(1000))
    clean, flooded = [], []
    for _ in range(TIMED):
        clean.append(_timed_prefetch(server.url, "clean-model", query, genuine))
        flooded.append(_timed_prefetch(server.url, "test-model", query, genuine))
    clean_s, flooded_s = statistics.median(clean), statistics.median(flooded)
    print(f"\nlookup with the index clean {clean_s * 1e3:.2f} ms, with {JUNK} junk members {flooded_s * 1e3:.2f} ms "
          f"(median of {TIMED})")
    assert flooded_s < 2 * clean_s + 0.005, (clean_s, flooded_s)   # a few ms of margin for a loaded machine


def test_an_index_key_of_another_type_reads_as_empty(server):
    a = router_store(server.url)
    tokens = list(range(1, 12))
    put(a, tokens)
    assert a.shared.flush(5)
    r = server.client()
    bits = f"{NS}tailbits:{next(chain(tokens, BLOCK)).hex()}"
    r.delete(bits)
    r.sadd(bits, *range(JUNK // 10))
    assert router_store(server.url).prefetch(tokens) == 0


def test_the_store_url_says_where_tls_is_used(tmp_path):
    assert check_store_url("redis://127.0.0.1:6379/0") == {}
    assert check_store_url("rediss://10.0.0.1:6379/0", "/ca.pem", "/me.pem") == {"ssl_ca_certs": "/ca.pem",
                                                                                "ssl_certfile": "/me.pem"}
    with pytest.raises(StoreAddressError, match="rediss://"):
        check_store_url("redis://10.0.0.1:6379/0", "/ca.pem")


def test_a_rediss_store_is_reached_over_tls_and_checked_against_its_ca(tmp_path):
    with RedisServer(tmp_path, tls=True).start() as server:
        a = router_store(server.url, ssl=check_store_url(server.url, str(server.ca)))
        tokens = list(range(1, 12))
        put(a, tokens)
        assert a.shared.flush(5)
        b = router_store(server.url, ssl=check_store_url(server.url, str(server.ca)))
        assert b.prefetch(tokens) == len(tokens)
        events = Events()
        stranger = router_store(server.url, events, timeout=0.5)   # no CA: the server's certificate is unknown
        assert stranger.prefetch(tokens) == 0 and events["fallback_lookup"] == 1


def test_a_forged_shared_prefix_changes_no_answer_of_two_real_routers(tmp_path):
    """A system prompt's snapshot in the store, forged as an attacker without the key can (the
    state after other text, filed under the prompt's keys, fresh checksums, signed with another
    key): both routers answer every question after it as a cold run does, and count it."""
    from common.kv_cache import DEFAULT_KV_TYPE
    from common.model.default import default_model_path
    from common.model.gguf_file import GGUFModel
    from common.snapshots import KV_BLOCK
    from tests.shared_stacks import READY_TIMEOUT_S, complete, metric, stack
    from tests.stack_helpers import DemoReference

    ref = DemoReference()
    system, other = ref.corpus[:128], ref.corpus[128:256]
    questions = [ref.corpus[400 + 40 * i:410 + 40 * i] for i in range(3)]
    with RedisServer(tmp_path).start() as server:
        model_id = GGUFModel(default_model_path()).fingerprint
        forger = SnapshotStore(ref.config, 1 << 30, KV_BLOCK, kv_type=DEFAULT_KV_TYPE, shared=rt.RedisTier(
            server.url, ref.config, DEFAULT_KV_TYPE, KV_BLOCK, model_id, key=derive_key("not this deployment's")))
        state = ref.reference.new_state()
        forger.put(system, state, ref.reference.prefill(other, state))
        assert forger.shared.flush(30)
        with stack(tmp_path, "a", server.url) as a, stack(tmp_path, "b", server.url) as b:
            a.wait_ready(READY_TIMEOUT_S)
            b.wait_ready(READY_TIMEOUT_S)
            for q in questions:
                cold = ref.text(ref.cold(system + q, 8))
                assert complete(a, system + q, 8) == cold
                assert complete(b, system + q, 8) == cold
            rejected = [metric(s, "router", "fermium_snapshot_store_rejected_total") for s in (a, b)]
            assert sum(rejected) >= 1, rejected
