"""Worker admission: the worker token and its file, the bounded registry, a Hello flood that
must neither connect out nor stall the event loop, and a worker dropped the moment its
connection closes. The router's Dispatcher runs in this process, on real sockets."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest

from common.kv_cache import DEFAULT_KV_TYPE
from common.metrics import RouterMetrics
from common.mp import PullQueue, PushQueue
from common.protocol.router import DecodeStep, Failed, Heartbeat, Hello, Tokens
from common.protocol.worker import Cancel, HelloAck
from common.worker import WorkerLink
from common.worker_token import matches, resolve, shared_token
from services.router.engine.dispatch import Dispatcher, Track
from services.router.engine.workers import RegistryFull, WorkerRegistry

TOKEN = "s3cret-token"
FLOOD = 200
SETTLE_S = 3.0               # for messages sent to arrive and be handled, on a busy 2-core host
# the event loop must keep serving through a flood (five fake Hellos once stalled it 9.7 s);
# refusing costs next to nothing, while each admitted re-registration connects a socket
# (about 1 ms), and a flood that arrives at once is handled in one pass of the loop
REFUSAL_STALL_S = 0.1
REREGISTRATION_STALL_S = 0.5
DISCONNECT_WITHIN_S = 0.5    # a closed connection drops its worker this fast (heartbeats: 2.5 s)


# ---- the token and its file --------------------------------------------------------------


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    monkeypatch.delenv("FERMIUM_WORKER_TOKEN", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "fermium" / "worker-token"


def test_token_file_is_private_and_shared(state_home):
    token = resolve()
    assert len(token) == 64 and state_home.read_text() == token
    assert oct(state_home.stat().st_mode & 0o777) == "0o600"
    assert oct(state_home.parent.stat().st_mode & 0o777) == "0o700"
    assert resolve() == token and resolve("given") == "given"
    os.environ["FERMIUM_WORKER_TOKEN"] = "from-env"
    try:
        assert resolve() == "from-env"
    finally:
        del os.environ["FERMIUM_WORKER_TOKEN"]
    state_home.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        shared_token()


def test_processes_starting_at_once_agree_on_one_token(state_home):
    code = "from common.worker_token import resolve; print(resolve())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()}) for _ in range(6)]
    tokens = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert tokens == {state_home.read_text()}


def test_matches_never_accepts_an_empty_token():
    assert matches("abc", "abc") and not matches("abd", "abc") and not matches("", "abc")
    assert not matches("", "")


# ---- the registry ---------------------------------------------------------------------------


class FakeLink:
    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_registry_is_bounded_and_names_the_lost_worker():
    connected = []
    reg = WorkerRegistry(timeout=2.0, connect=lambda a: connected.append(a) or FakeLink(), max_per_role=2)
    reg.register("d1", "decode", "tcp://a:1", 4, "m")
    reg.register("d2", "decode", "tcp://a:2", 4, "m")
    with pytest.raises(RegistryFull, match="2 decode workers"):
        reg.register("d3", "decode", "tcp://a:3", 4, "m")
    assert connected == ["tcp://a:1", "tcp://a:2"]                    # refused before connecting
    reg.register("d4", "decode", "tcp://a:2", 4, "m")                  # a restart replaces, always fits
    reg.register("p1", "prefill", "tcp://a:5", 1, "m")                 # the bound is per role
    assert sorted(reg.workers) == ["d1", "d4", "p1"]
    link = reg.workers["p1"].link
    assert reg.remove(link, "its connection closed").worker_id == "p1" and link.closed
    assert reg.remove(link, "again") is None
    assert reg.lost["prefill"].worker_id == "p1" and reg.lost["prefill"].why == "its connection closed"
    reg.register("p2", "prefill", "tcp://a:6", 1, "m")
    assert "prefill" not in reg.lost


# ---- the dispatcher on real sockets ---------------------------------------------------------


class Router:
    """A Dispatcher on its own event loop task, with the loop's longest stall measured."""

    def __init__(self, **kw):
        self.dispatcher = Dispatcher("tcp://127.0.0.1:0", heartbeat_timeout=10, metrics=RouterMetrics(),
                                     token=TOKEN, **kw)
        self.connects = 0
        connect = self.dispatcher.registry._connect

        def counting(address: str):
            self.connects += 1
            return connect(address)

        self.dispatcher.registry._connect = counting
        self.stall = 0.0

    async def __aenter__(self) -> "Router":
        await self.dispatcher.start()
        self._ticker = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        self._ticker.cancel()
        await self.dispatcher.close()

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.stall, last = max(self.stall, now - last), now

    def push(self) -> PushQueue:
        return PushQueue(self.dispatcher.inbox.address, name="test->router")

    def refused(self, reason: str) -> float:
        m = self.dispatcher.metrics
        return m.registry.get_sample_value("fermium_protocol_errors_total", {"service": "router", "reason": reason})


def hello(worker_id: str, address: str, token: str = TOKEN, role: str = "decode",
          kv_type: str = DEFAULT_KV_TYPE) -> Hello:
    return Hello(uuid.uuid4().hex, worker_id, role, address, 4, "m", token, kv_type)


async def until(condition, timeout: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_hellos_without_the_token_connect_nowhere_and_do_not_stall():
    async def main():
        async with Router() as r:
            push = r.push()
            for i in range(FLOOD):
                push.put(hello(f"fake-{i}", f"tcp://127.0.0.1:{10000 + i}", token="wrong" if i % 2 else ""))
                push.put(Heartbeat(uuid.uuid4().hex, f"fake-{i}", "decode", "tcp://127.0.0.1:1", 4, "m", 0, 0, ""))
            await until(lambda: r.refused("unauthorized") == 2 * FLOOD)
            push.close()
            assert r.connects == 0 and not r.dispatcher.registry.workers
            print(f"longest event-loop stall: {r.stall * 1000:.1f} ms")
            assert r.stall < REFUSAL_STALL_S, r.stall
    asyncio.run(main())


def test_registrations_are_bounded_and_a_re_hello_flood_does_not_stall():
    async def main():
        async with Router(max_workers=3) as r:
            push = r.push()
            for i in range(10):
                push.put(hello(f"d{i}", f"tcp://127.0.0.1:{20000 + i}"))
            await until(lambda: r.refused("invalid") == 7)
            assert r.dispatcher.registry.count("decode") == 3 and r.connects == 3
            for i in range(FLOOD):                         # a new worker id at one address each time
                push.put(hello(f"again-{i}", "tcp://127.0.0.1:20000"))
            await until(lambda: "again-%d" % (FLOOD - 1) in r.dispatcher.registry.workers)
            push.close()
            assert r.dispatcher.registry.count("decode") == 3
            print(f"longest event-loop stall: {r.stall * 1000:.1f} ms")
            assert r.stall < REREGISTRATION_STALL_S, r.stall
    asyncio.run(main())


def test_a_worker_is_dropped_when_its_connection_closes_and_orphans_are_cancelled():
    async def main():
        async with Router() as r:
            inbox = PullQueue("tcp://127.0.0.1:0", name="fake-decode")
            push = r.push()
            push.put(hello("d1", inbox.address))
            ack = await asyncio.to_thread(inbox.get, SETTLE_S)
            assert isinstance(ack, HelloAck) and ack.accepted
            for _ in range(2):                             # tokens of a request the router does not hold
                push.put(DecodeStep("", "d1", [Tokens("orphan", [1])]))
            cancel = await asyncio.to_thread(inbox.get, SETTLE_S)
            assert isinstance(cancel, Cancel) and cancel.rid == "orphan"
            assert await asyncio.to_thread(inbox.get, 0.3) is None          # once, not per message
            track = Track("r1", (1, 2), "", "d1")
            r.dispatcher.tracks["r1"] = track
            r.dispatcher.registry.workers["d1"].inflight.add("r1")
            inbox.close(wait=1.0)
            t0 = time.monotonic()
            failed = await asyncio.wait_for(track.events.get(), SETTLE_S)
            assert time.monotonic() - t0 < DISCONNECT_WITHIN_S
            assert isinstance(failed, Failed) and "d1" in failed.error and "stopped responding" in failed.error
            assert not r.dispatcher.registry.workers and r.dispatcher.registry.lost["decode"].worker_id == "d1"
            push.close()
    asyncio.run(main())


def test_a_worker_of_another_kv_type_is_refused_with_the_reason(caplog):
    async def main():
        async with Router(kv_type="f16") as r:
            inbox = PullQueue("tcp://127.0.0.1:0", name="fake-decode")
            push = r.push()
            push.put(hello("d32", inbox.address, kv_type="f32"))
            ack = await asyncio.to_thread(inbox.get, SETTLE_S)
            assert isinstance(ack, HelloAck) and not ack.accepted
            assert "keeps its KV cache in 'f32', the router in 'f16'" in ack.reason
            assert "prefill and decode with the same --kv-type" in ack.reason
            push.put(Heartbeat(uuid.uuid4().hex, "d32", "decode", inbox.address, 4, "m", 0, 0, TOKEN, "f32"))
            await until(lambda: r.refused("invalid") == 2)
            assert not r.dispatcher.registry.workers
            link = WorkerLink("prefill", router_address=r.dispatcher.inbox.address, inbox_address="tcp://127.0.0.1:0",
                              advertise=None, capacity=1, model="m", load=lambda: (0, 0), token=TOKEN, kv_type="q8_0")
            try:                               # a real worker's start fails, saying why
                with pytest.raises(RuntimeError, match=r"refused this prefill worker: .*'q8_0', the router in 'f16'"):
                    await asyncio.to_thread(link.start, SETTLE_S)
            finally:
                link.close()
            push.put(hello("d16", inbox.address))
            ack = await asyncio.to_thread(inbox.get, SETTLE_S)
            assert ack.accepted and list(r.dispatcher.registry.workers) == ["d16"]
            push.close()
            inbox.close()
    with caplog.at_level("ERROR", logger="fermium.router"):
        asyncio.run(main())
    assert "refused a Hello of 'decode' worker 'd32'" in caplog.text and "'f32'" in caplog.text


def test_worker_link_shows_its_token():
    router = PullQueue("tcp://127.0.0.1:0", name="router")
    link = WorkerLink("decode", router_address=router.address, inbox_address="tcp://127.0.0.1:0", advertise=None,
                      capacity=1, model="m", load=lambda: (0, 0), token="t0k3n")
    try:
        with pytest.raises(TimeoutError, match="--worker-token"):      # nobody answers: the hint names it
            link.start(timeout=0.5)
        got = router.get(SETTLE_S)
        assert isinstance(got, Hello) and got.token == "t0k3n"
    finally:
        link.close()
        router.close()
