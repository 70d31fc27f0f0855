"""Admission counts sequences, not requests (issue 42, case 5): `n` takes n of --max-running's
slots, a decode worker never holds more sequences than its --capacity (the rest wait in the
router, which counts each worker's room), `n` above --max-n is a 400 naming the field; and a small
chat beside many `n` requests is served. Real processes for the stack; the two queues alone too."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from services.router.engine.admission import Admission
from services.router.engine.decode_room import DecodeRoom
from services.router.engine.workers import WorkerRegistry
from tests.stack_helpers import metered_demo_stack
from tests.test_services_e2e import scrape

READY_TIMEOUT_S = 60
CAPACITY, BATCH, MAX_N = 6, 4, 4
REQUESTS, MAX_TOKENS = 6, 16         # 24 sequences asked at once for a worker that holds 6
SMALL_WITHIN_S = 60                  # generous: a loaded 2-core machine; the figure is printed
PEAK = "fermium_decode_sequences_peak{}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    extra = {"decode": ["--capacity", str(CAPACITY), "--max-batch", str(BATCH)], "router": ["--max-n", str(MAX_N)]}
    with metered_demo_stack(tmp_path_factory.mktemp("stack"), READY_TIMEOUT_S, extra=extra) as s:
        yield s


def chat(url: str, n: int, max_tokens: int, text: str = "Speak, what news from Mantua?") -> tuple[int, float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                   json={"model": "fermium", "messages": [{"role": "user", "content": text}], "n": n,
                         "max_tokens": max_tokens, "temperature": 1, "seed": 3})
    return r.status_code, time.perf_counter() - t0, r.json()


def test_decode_never_holds_more_than_its_capacity_and_a_small_chat_is_served(stack):
    with ThreadPoolExecutor(REQUESTS + 1) as pool:
        many = [pool.submit(chat, stack.url, MAX_N, MAX_TOKENS) for _ in range(REQUESTS)]
        time.sleep(0.2)
        small = pool.submit(chat, stack.url, 1, 4, "hi")
        results = [f.result() for f in many]
        status, took, body = small.result()
    assert status == 200, body
    assert all(s == 200 and len(b["choices"]) == MAX_N for s, _, b in results), [b for s, _, b in results if s != 200]
    peak = scrape(stack.metrics_ports["decode"])[PEAK]
    print(f"\ndecode peak {peak:g} sequences for capacity {CAPACITY}; small chat {took:.2f} s beside "
          f"{REQUESTS} n={MAX_N} requests (slowest {max(t for _, t, _ in results):.2f} s)")
    assert BATCH <= peak <= CAPACITY
    assert took < SMALL_WITHIN_S


def test_n_above_max_n_is_a_400_naming_n(stack):
    status, _, body = chat(stack.url, MAX_N + 1, 4)
    assert status == 400 and body["error"]["param"] == "n" and "--max-n" in body["error"]["message"]


def test_admission_counts_the_sequences_of_n():
    async def main():
        adm = Admission(max_running=8, max_queue=4)
        await adm.acquire(6)
        big = asyncio.ensure_future(adm.acquire(4))     # 10 > 8: waits
        small = asyncio.ensure_future(adm.acquire(1))    # fits, but does not overtake the first waiter
        await asyncio.sleep(0)
        assert adm.running == 6 and not big.done() and not small.done()
        adm.release(6)
        await asyncio.sleep(0)
        assert big.done() and small.done() and adm.running == 5
        adm.release(4)
        adm.release(1)
        await adm.acquire(50)                            # more than all: takes all, so it does not wait forever
        assert adm.running == 8
        adm.release(50)
        assert adm.running == 0
    asyncio.run(main())


class _Link:
    def close(self) -> None:
        pass


def test_decode_room_holds_the_rest_in_the_router():
    async def main():
        reg = WorkerRegistry(60.0, lambda address: _Link())
        reg.register("d1", "decode", "tcp://d1", capacity=4, model="m")
        room = DecodeRoom(reg, lambda n: RuntimeError("no decode worker"))
        await room.reserve(3)
        reg.workers["d1"].inflight.update({"a", "b", "c"})   # submitted
        room.settle(3)
        second = asyncio.ensure_future(room.reserve(2))  # 1 free of 4
        await asyncio.sleep(0)
        assert not second.done() and room.free() == 1
        reg.heartbeat("d1", running=4, waiting=0)       # another router's sequence: still no room
        reg.workers["d1"].inflight.discard("a")
        room.wake()
        await asyncio.sleep(0)
        assert not second.done()
        reg.heartbeat("d1", running=2, waiting=0)
        room.wake()
        await asyncio.sleep(0)
        assert second.done() and room.reserved == 2
        room.settle(2)
        third = asyncio.ensure_future(room.reserve(9))   # more than the capacity: waits for all of it
        await asyncio.sleep(0)
        reg.close()
        reg.workers.clear()
        room.wake()
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="no decode worker"):
            await third
    asyncio.run(main())
