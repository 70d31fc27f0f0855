"""Admission control, counted in sequences: a request of `n` choices takes n of the `max_running`
slots (one more than `max_running` would never fit: it takes them all); at most `max_queue`
requests wait for their slots, first come, first served; one more is refused with QueueFull."""
from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, max_running: int, max_queue: int):
        self.max_running, self.max_queue = max_running, max_queue
        self.running = 0                                   # sequences admitted
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _cost(self, n: int) -> int:
        return max(1, min(n, self.max_running))

    async def acquire(self, n: int = 1) -> None:
        k = self._cost(n)
        if self.running + k <= self.max_running and not self._waiters:
            self.running += k
            return
        if len(self._waiters) >= self.max_queue:
            raise QueueFull(f"{self.running} sequences running and {len(self._waiters)} requests waiting")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((k, fut))
        try:
            await fut                   # _grant counted its slots in `running`
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)         # the slots arrived just as the client left
            else:
                self._waiters.remove((k, fut))
                self._grant()           # a smaller request behind it may fit now
            raise

    def release(self, n: int = 1) -> None:
        self.running -= self._cost(n)
        self._grant()

    def _grant(self) -> None:
        """Admit waiters in order while the first one fits (no overtaking, so a large `n` is not starved)."""
        while self._waiters:
            k, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.running + k > self.max_running:
                return
            self._waiters.popleft()
            self.running += k
            fut.set_result(None)
