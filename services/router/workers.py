"""The registry of attached workers: registration, heartbeats, load, death. Plain Python.

A worker is alive until its connection drops (`remove`, at once) or until `timeout` seconds
pass without a heartbeat (`reap`, the fallback when a host vanishes without closing its
connections). A dead worker is removed, and the caller must fail the requests it held. A worker
that comes back (a new worker id at the same address) replaces the old entry. At most
`max_per_role` workers of a role are held, so registrations cannot grow it without bound.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

ROLES = ("prefill", "decode")
MAX_PER_ROLE = 64


class RegistryFull(ValueError):
    pass


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


@dataclass(frozen=True)
class Lost:
    """The last worker of a role that died, named by /health while the role has none."""

    worker_id: str
    address: str
    why: str
    at: float


class WorkerRegistry:
    def __init__(self, timeout: float, connect: Callable[[str], Any], clock: Callable[[], float] = time.monotonic,
                 max_per_role: int = MAX_PER_ROLE):
        self.timeout = timeout
        self.max_per_role = max_per_role
        self._connect = connect
        self._clock = clock
        self.workers: dict[str, Worker] = {}
        self.lost: dict[str, Lost] = {}

    def register(self, worker_id: str, role: str, address: str, capacity: int, model: str) -> list[Worker]:
        """Add a worker; returns the entries it replaces (same address: a restart).

        Raises ValueError for an unknown role and RegistryFull when the role has its maximum,
        both before anything is connected."""
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; roles are {', '.join(ROLES)}")
        if worker_id in self.workers:
            self.workers[worker_id].last_seen = self._clock()
            return []
        replaced = [w for w in self.workers.values() if w.address == address]
        if self.count(role) - sum(w.role == role for w in replaced) >= self.max_per_role:
            raise RegistryFull(f"{self.max_per_role} {role} workers are attached already (--max-workers)")
        for w in replaced:
            self._drop(w)
        self.workers[worker_id] = Worker(worker_id, role, address, capacity, model,
                                         self._connect(address), self._clock())
        self.lost.pop(role, None)
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
            self._drop(w, f"no heartbeat for {self.timeout:g} s")
        return dead

    def remove(self, link: Any, why: str) -> Worker | None:
        """Remove the worker behind `link` (its connection dropped); None when none is."""
        w = next((w for w in self.workers.values() if w.link is link), None)
        if w is not None:
            self._drop(w, why)
        return w

    def _drop(self, w: Worker, why: str = "") -> None:
        self.workers.pop(w.worker_id, None)
        w.link.close()
        if why and not self.count(w.role):
            self.lost[w.role] = Lost(w.worker_id, w.address, why, self._clock())

    def count(self, role: str) -> int:
        return sum(w.role == role for w in self.workers.values())

    def close(self) -> None:
        for w in list(self.workers.values()):
            self._drop(w)
