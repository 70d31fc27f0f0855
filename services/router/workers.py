"""The registry of attached workers: registration, heartbeats, load, death. Plain Python.

A worker is alive while its heartbeats arrive; after `timeout` seconds of silence it is dead
and is removed, and the requests it held must be failed by the caller. A worker that comes
back (a new worker id at the same address) replaces the old entry.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

ROLES = ("prefill", "decode")


@dataclass
class Worker:
    worker_id: str
    role: str
    address: str
    capacity: int
    model: str
    link: Any                          # PushQueue to the worker's inbox
    last_seen: float
    reported: tuple[int, int] = (0, 0)  # (running, waiting) from the last heartbeat
    inflight: set[str] = field(default_factory=set)

    @property
    def load(self) -> float:
        return max(len(self.inflight), sum(self.reported)) / max(1, self.capacity)


class WorkerRegistry:
    def __init__(self, timeout: float, connect: Callable[[str], Any], clock: Callable[[], float] = time.monotonic):
        self.timeout = timeout
        self._connect = connect
        self._clock = clock
        self.workers: dict[str, Worker] = {}

    def register(self, worker_id: str, role: str, address: str, capacity: int, model: str) -> list[Worker]:
        """Add a worker; returns the entries it replaces (same address: a restart)."""
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; roles are {', '.join(ROLES)}")
        if worker_id in self.workers:
            self.workers[worker_id].last_seen = self._clock()
            return []
        replaced = [w for w in self.workers.values() if w.address == address]
        for w in replaced:
            self._drop(w)
        self.workers[worker_id] = Worker(worker_id, role, address, capacity, model,
                                         self._connect(address), self._clock())
        return replaced

    def heartbeat(self, worker_id: str, running: int, waiting: int) -> bool:
        """False when the worker is unknown (it must register)."""
        w = self.workers.get(worker_id)
        if w is None:
            return False
        w.last_seen, w.reported = self._clock(), (running, waiting)
        return True

    def pick(self, role: str) -> Worker | None:
        """The least-loaded live worker of a role."""
        live = [w for w in self.workers.values() if w.role == role]
        return min(live, key=lambda w: (w.load, len(w.inflight)), default=None)

    def reap(self) -> list[Worker]:
        """Remove and return the workers silent for longer than the timeout."""
        now = self._clock()
        dead = [w for w in self.workers.values() if now - w.last_seen > self.timeout]
        for w in dead:
            self._drop(w)
        return dead

    def _drop(self, w: Worker) -> None:
        self.workers.pop(w.worker_id, None)
        w.link.close()

    def count(self, role: str) -> int:
        return sum(w.role == role for w in self.workers.values())

    def close(self) -> None:
        for w in list(self.workers.values()):
            self._drop(w)
