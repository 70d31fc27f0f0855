"""Liveness as progress: which attached workers have stalled, and which of their heartbeats to refuse.

A heartbeat proves that a worker's process lives; its `steps` and `busy` (common.liveness) prove
that its compute loop does. A worker that is busy while its steps stay put for `timeout` seconds
has stalled: the dispatcher removes it (its requests fail with a retryable error, it gets no new
work), /health answers 503 naming it, and its heartbeats are answered with a refused HelloAck, on
which the worker exits for its supervisor to restart. A stalled worker whose steps move again is
forgotten (its next heartbeat registers it anew); one silent for `forget_after` (it exited) is
forgotten too, and so is one whose address a new worker registers at (its restart). A timeout of
0 turns all of it off, as `fermium local` does: its workers are threads with no process to restart.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from common.protocol.router import Failed

from .workers import Worker

TELL_EVERY_S = 6.0       # a stalled worker's refusal is sent again after this (common.mp's send timeout)


class StallFailed(Failed):
    """The end the router gives the requests of a stalled worker: retryable (errors.Stalled)."""


@dataclass
class Stalled:
    worker_id: str
    role: str
    address: str
    steps: int           # where its loop stopped
    at: float            # when it was found stalled
    seen: float          # its last heartbeat
    told: float = 0.0    # when it was last sent its refusal


class StallWatch:
    def __init__(self, timeout: float, forget_after: float, clock: Callable[[], float] = time.monotonic):
        self.timeout, self.forget_after, self._clock = timeout, forget_after, clock
        self._moved: dict[str, tuple[int, float, bool]] = {}   # worker id -> (steps, since when busy at those, busy)
        self.stalled: dict[str, Stalled] = {}

    def beat(self, worker_id: str, steps: int, busy: bool) -> None:
        """A heartbeat of an attached worker."""
        if not self.timeout:
            return
        last = self._moved.get(worker_id)
        if last is None or not (busy and last[2]) or steps != last[0]:
            self._moved[worker_id] = (steps, self._clock(), busy)

    def check(self, workers: dict[str, Worker]) -> list[Worker]:
        """The attached workers that stalled now; the caller removes them and fails their requests."""
        now = self._clock()
        for wid in [wid for wid in self._moved if wid not in workers]:
            del self._moved[wid]
        for s in [s for s in self.stalled.values() if now - s.seen > self.forget_after]:
            del self.stalled[s.worker_id]
        if not self.timeout:
            return []
        stuck = [w for wid, w in workers.items()
                 if wid in self._moved and self._moved[wid][2] and now - self._moved[wid][1] > self.timeout]
        for w in stuck:
            self.stalled[w.worker_id] = Stalled(w.worker_id, w.role, w.address, self._moved.pop(w.worker_id)[0],
                                                now, now)
        return stuck

    def held(self, worker_id: str, steps: int) -> bool:
        """Whether a heartbeat of this worker is refused: it stalled, and its steps have not moved."""
        s = self.stalled.get(worker_id)
        if s is None:
            return False
        if steps != s.steps:              # its loop came back: it may register again
            del self.stalled[worker_id]
            return False
        s.seen = self._clock()
        return True

    def tell(self, worker_id: str) -> bool:
        """Whether to send a held worker its refusal now: at most every TELL_EVERY_S."""
        s, now = self.stalled[worker_id], self._clock()
        if s.told and now - s.told < TELL_EVERY_S:
            return False
        s.told = now
        return True

    def replaced(self, address: str) -> None:
        """A worker registered at `address`: a stalled one there was restarted."""
        for s in [s for s in self.stalled.values() if s.address == address]:
            del self.stalled[s.worker_id]

    def report(self) -> list[dict]:
        """/health's list of stalled workers."""
        now = self._clock()
        return [{"id": s.worker_id, "role": s.role, "address": s.address, "steps": s.steps,
                 "reason": f"its loop made no progress for {self.timeout:g} s while it had work",
                 "seconds_ago": round(now - s.at, 3)} for s in self.stalled.values()]
