"""The snapshot disk tier's writer (common/snapshots/disk_writer.py, disk_tier.py): writes leave
the caller's thread, so a router answers HTTP while a slow write is under way; a full queue
drops a write rather than wait; the byte budget holds, least recently used first, also at
start; and a write that fails (a full disk) or is dropped shows in the router's metrics."""
from __future__ import annotations

import asyncio
import errno
import threading
import time

import httpx
import numpy as np
import uvicorn

from common.metrics import RouterMetrics
from common.snapshots import SnapshotStore, disk
from common.snapshots.disk_writer import QUEUE_LIMIT
from common.snapshots.keys import prefix_key
from services.router.engine.prefix_cache import build_snapshot_cache
from tests.test_shared_snapshots import Events
from tests.test_snapshot_store import BLOCK, CFG, assert_same, put, state_after

SLOW_WRITE_S = 1.5              # a write this slow: longer than a 35B-sized one was seen to take
PROBE_LIMIT_S = 0.5             # a probe answered within this is prompt, with margin for a loaded machine


def sizes(folder) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.snap"))


def test_the_budget_holds_least_recently_used_first(tmp_path):
    events = Events()
    prompts = [[i] * 11 for i in range(1, 6)]
    first = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, disk_budget=0)
    put(first, prompts[0])
    one = sizes(tmp_path)
    store = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, disk_budget=int(3.5 * one), events=events)
    for p in prompts[1:3]:
        put(store, p)
    assert store.lookup(prompts[0]) is not None                # used: the first is now the most recent
    for p in prompts[3:]:
        put(store, p)
    assert sizes(tmp_path) <= 3.5 * one and store.disk_bytes == sizes(tmp_path)
    assert events["evicted"] == 2 and events["written"] == 4
    kept = {p[0] for p in prompts if (tmp_path / f"{prefix_key(p, BLOCK).hex()}.snap").exists()}
    assert kept == {1, 4, 5}                                   # 2 and 3 were the least recently used
    again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, disk_budget=int(1.5 * one), events=events)
    assert sizes(tmp_path) <= 1.5 * one and len(again.snaps) == 1 and events["evicted"] == 4
    assert_same(again.lookup(prompts[4])[0], state_after(prompts[4]))   # the newest file stays, whole


def test_a_snapshot_evicted_from_ram_before_its_file_is_written_is_found_on_disk(tmp_path, monkeypatch):
    gate = threading.Event()
    write = disk.write_atomic
    monkeypatch.setattr(disk, "write_atomic", lambda *a: gate.wait(10) and write(*a))
    one = state_after([1] * 11).nbytes
    store = SnapshotStore(CFG, int(1.5 * one), block=BLOCK, disk_dir=tmp_path)
    store.put([1] * 11, state_after([1] * 11), np.ones(CFG.vocab_size, np.float32))
    store.put([2] * 11, state_after([2] * 11), np.ones(CFG.vocab_size, np.float32))   # evicts the first from RAM
    gate.set()
    assert store.flush(10)
    assert_same(store.lookup([1] * 12)[0], state_after([1] * 11))


def test_a_full_queue_drops_the_write_without_waiting(tmp_path, monkeypatch):
    gate, started, events = threading.Event(), threading.Event(), Events()
    write = disk.write_atomic
    monkeypatch.setattr(disk, "write_atomic", lambda *a: started.set() or gate.wait(10) and write(*a))
    store = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, events=events)
    slowest = 0.0
    for i in range(QUEUE_LIMIT + 3):                           # one being written, QUEUE_LIMIT waiting, two more
        t0 = time.perf_counter()
        store.put([i + 1] * 11, state_after([i + 1] * 11), np.ones(CFG.vocab_size, np.float32))
        slowest = max(slowest, time.perf_counter() - t0)
        assert i or started.wait(10)                           # the first is under way before the rest queue
    assert slowest < PROBE_LIMIT_S
    gate.set()
    assert store.flush(10)
    assert events["dropped"] == 2 and events["written"] == QUEUE_LIMIT + 1
    assert len(list(tmp_path.glob("*.snap"))) == QUEUE_LIMIT + 1
    assert store.lookup([QUEUE_LIMIT + 3] * 12)[0].pos == 11   # dropped from the disk, not from RAM


def metric(metrics: RouterMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_disk_full_write_is_counted_and_the_snapshot_stays_in_ram(tmp_path, monkeypatch):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(disk, "write_atomic", full)
    metrics = RouterMetrics()
    cache = build_snapshot_cache(CFG, metrics, 1 << 30, str(tmp_path), 0, "abc", "f32", disk_budget=1 << 30)
    s = state_after(list(range(1, 12)))
    assert cache.store_state(list(range(1, 12)), 11, s.arrays(), np.ones(CFG.vocab_size, np.float32),
                             "prefill", "f32") is not None
    assert cache.store.flush(10)
    assert metric(metrics, "fermium_snapshot_disk_writes_total", outcome="failed") == 1
    assert metric(metrics, "fermium_snapshot_disk_writes_total", outcome="written") == 0
    assert cache.lookup(list(range(1, 14)))[0] == 11


def test_the_router_answers_http_while_a_slow_snapshot_write_is_under_way(tmp_path, monkeypatch):
    """A real router app on uvicorn; a snapshot is stored on its event loop, as dispatch does,
    with a disk that takes SLOW_WRITE_S per file: /health probes meanwhile are answered at once."""
    from common.model.default import default_model_path
    from fermium.stack import free_port
    from services.router.config import RouterConfig
    from services.router.server import build_router
    from tests.stack_helpers import DemoReference

    write, started = disk.write_atomic, threading.Event()

    def slow(*args):
        started.set()
        time.sleep(SLOW_WRITE_S)
        return write(*args)
    monkeypatch.setattr(disk, "write_atomic", slow)
    ref = DemoReference()
    ids = ref.corpus[:64]
    state = ref.reference.new_state()
    logits = ref.reference.prefill(ids, state)
    port = free_port()
    cfg = RouterConfig(model=str(default_model_path()), port=port, workers=f"tcp://127.0.0.1:{free_port()}",
                       snapshot_dir=str(tmp_path), snapshot_every=0, worker_token="t" * 16)
    app, engine = build_router(cfg)
    dispatcher = engine.dispatcher
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/health"
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        httpx.get(url, timeout=5)
        loop.call_soon_threadsafe(dispatcher.cache.store_state, ids, len(ids), state.arrays(), logits, "prefill",
                                  dispatcher.cache.store.kv_type)
        assert started.wait(10)
        slowest, probes = 0.0, 0
        while not dispatcher.cache.store.flush(0):             # the write is under way
            t0 = time.perf_counter()
            assert httpx.get(url, timeout=10).status_code in (200, 503)
            slowest, probes = max(slowest, time.perf_counter() - t0), probes + 1
            time.sleep(0.05)
        print(f"\n{probes} /health probes during a {SLOW_WRITE_S} s snapshot write: slowest {slowest * 1e3:.1f} ms")
        assert probes >= 3 and slowest < PROBE_LIMIT_S
        assert len(list(dispatcher.cache.store.disk_dir.glob("*.snap"))) == 1
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_router_takes_the_disk_budget_and_the_store_settings():
    import typer.main

    from fermium.cli import app
    params = typer.main.get_command(app).commands["router"].params
    opts = {o: p for p in params for o in p.opts}
    for option in ("--snapshot-disk-budget", "--snapshot-key", "--snapshot-store-ca", "--snapshot-store-cert"):
        assert option in opts and opts[option].help, option
    assert opts["--snapshot-disk-budget"].default == 20                # GiB


def test_a_file_is_read_into_ram_off_the_loop_before_the_lookup(tmp_path, monkeypatch):
    """The router's prefetch (on a thread) reads a disk-only snapshot; lookup, on the loop, reads no file."""
    from services.router.engine.prefix_cache import SnapshotCache
    one = state_after([1] * 11).nbytes
    store = SnapshotStore(CFG, int(1.5 * one), block=BLOCK, disk_dir=tmp_path)
    put(store, [1] * 11)
    put(store, [2] * 11)                                       # the first is now on disk alone
    assert store.snaps[prefix_key([1] * 11, BLOCK)].recurrent is None
    cache = SnapshotCache(CFG, store, RouterMetrics(), 0)
    assert asyncio.run(cache.prefetch([1] * 12)) == 11

    def no_reads(*args):
        raise AssertionError("lookup read a file")
    monkeypatch.setattr(disk, "read_checked", no_reads)
    assert cache.lookup([1] * 12)[0] == 11
    assert_same(store.lookup([1] * 12)[0], state_after([1] * 11))


def test_the_router_keeps_a_messages_recurrent_state_without_copying_it(tmp_path):
    """store_state runs on the event loop: the message's recurrent arrays and logits are kept as
    they are (a 35B-sized copy there held the loop for a tenth of a second and more)."""
    cache = build_snapshot_cache(CFG, RouterMetrics(), 1 << 30, str(tmp_path), 0, "abc", "f32")
    s = state_after(list(range(1, 12)))
    arrays, logits = s.arrays(), np.ones(CFG.vocab_size, np.float32)
    key = cache.store_state(list(range(1, 12)), 11, arrays, logits, "prefill", "f32")
    snap = cache.store.snaps[key]
    assert all(x is y for x, y in zip(snap.recurrent, arrays)) and snap.logits is logits
    assert cache.store.flush(10)
    assert_same(SnapshotStore(CFG, 1 << 30, block=cache.store.block, disk_dir=cache.store.disk_dir).lookup(
        list(range(1, 13)))[0], state_after(list(range(1, 12))))
