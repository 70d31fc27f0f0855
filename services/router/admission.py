"""Admission control: at most `max_running` requests at the workers, at most `max_queue`
waiting for a slot (first come, first served); one more is refused with QueueFull."""
from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, max_running: int, max_queue: int):
        self.max_running, self.max_queue = max_running, max_queue
        self.running = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise QueueFull(f"{self.running} requests running and {len(self._waiters)} waiting")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut                   # release() hands its slot over: running stays the same
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()          # the slot arrived just as the client left
            else:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1
