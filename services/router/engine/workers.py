"""The registry of attached workers: registration, heartbeats, load, death. Plain Python.

A worker is alive until its connection drops (`remove`, at once) or until `timeout` seconds
pass without a heartbeat (`reap`, the fallback when a host vanishes without closing its
connections). A dead worker is removed, and the caller must fail the requests it held. A worker
that comes back (a new worker id at the same address) replaces the old entry. At most
`max_per_role` workers of a role are held, so registrations cannot grow it without bound.
Hello and Heartbeat report a worker's batch `slots` and `hold_budget` (placement.py places by them).
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
    slots: int = 0                     # sequences one decode step advances; 0: not reported
    hold_budget: int = 0               # bytes of states a prefill worker keeps; 0: none

    @property
    def load(self) -> float:
        return max(len(self.inflight), sum(self.reported)) / max(1, self.capacity)

    @property
    def room(self) -> int:
        """Sequences it may still be sent: its capacity less what it holds (decode_room.py)."""
        return self.capacity - max(len(self.inflight), sum(self.reported))

    @property
    def free_slots(self) -> int | None:
        """Batch slots free now, counting what was sent since the last heartbeat; None: unknown."""
        return self.slots - max(len(self.inflight), sum(self.reported)) if self.slots else None


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

    def register(self, worker_id: str, role: str, address: str, capacity: int, model: str, slots: int = 0,
                 hold_budget: int = 0) -> list[Worker]:
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
                                         self._connect(address), self._clock(), slots=max(0, slots),
                                         hold_budget=max(0, hold_budget))
        self.lost.pop(role, None)
        return replaced

    def heartbeat(self, worker_id: str, running: int, waiting: int, slots: int = 0, hold_budget: int = 0) -> bool:
        """False when the worker is unknown (it must register)."""
        w = self.workers.get(worker_id)
        if w is None:
            return False
        w.last_seen, w.reported = self._clock(), (running, waiting)
        w.slots, w.hold_budget = max(0, slots), max(0, hold_budget)
        return True

    def pick(self, role: str) -> Worker | None:
        """A live worker of a role: for decode, the one with the most free batch slots (ties: the
        least loaded), by load alone while any has not reported its slots, and one at its capacity
        only when all are; otherwise the least loaded. Prefill workers are placed by the states
        they hold too (placement.py)."""
        live = [w for w in self.workers.values() if w.role == role]
        if role == "decode":                # a worker at its capacity only when all are
            live = [w for w in live if w.room > 0] or live
        if role == "decode" and all(w.free_slots is not None for w in live):
            return min(live, key=lambda w: (-w.free_slots, w.load, len(w.inflight)), default=None)
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
