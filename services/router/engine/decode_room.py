"""Decode capacity as a hard limit: the sequences of a request wait in the router until the decode
workers have room for all of them (`--capacity` of each, less what it holds), first come, first
served; a worker is never sent more sequences than its capacity.

A grant is reserved until the request has been submitted (which counts its copies in the workers'
`inflight`) and settled. Waiters are woken when a sequence ends, a heartbeat reports, or a worker
joins or leaves; with no decode worker left they fail with NoWorkers.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable


class DecodeRoom:
    def __init__(self, registry, no_workers: Callable[[int], Exception]):
        self.registry, self._no_workers = registry, no_workers
        self.reserved = 0                                   # granted, not yet submitted
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    def _decode(self) -> list:
        return [w for w in self.registry.workers.values() if w.role == "decode"]

    def free(self) -> int:
        return sum(max(0, w.room) for w in self._decode()) - self.reserved

    def _fits(self, n: int) -> int:
        """n, or all a request can ever get: the live workers' whole capacity."""
        return min(n, sum(w.capacity for w in self._decode()))

    async def reserve(self, n: int) -> None:
        if not self._decode() or not self._waiters and self._fits(n) <= self.free():   # none: submit says so
            self.reserved += n
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.settle(n)
            elif (n, fut) in self._waiters:
                self._waiters.remove((n, fut))
                self.wake()
            raise

    def settle(self, n: int) -> None:
        self.reserved -= n
        self.wake()

    def wake(self) -> None:
        """Grant the waiters in order while the first fits; fail them all when no decode worker is left."""
        if self._waiters and not self._decode():
            while self._waiters:
                n, fut = self._waiters.popleft()
                if not fut.done():
                    fut.set_exception(self._no_workers(n))
            return
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self._fits(n) > self.free():
                return
            self._waiters.popleft()
            self.reserved += n
            fut.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
