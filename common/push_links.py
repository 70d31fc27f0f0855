"""A worker's outgoing links to its peers by address (prefill -> decode workers, decode -> the
prefill workers holding states): reused, at most `max_links` of them (the least recently used is
closed first), and one unused for `idle_s` closed by reap(). On the worker's loop only; the
links' IO runs on their own threads.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from .mp import PushQueue
from .mp_local import push_queue


class PushLinks:
    def __init__(self, role: str, max_links: int, idle_s: float):
        self.role, self.max_links, self.idle_s = role, max_links, idle_s
        self.links: OrderedDict[str, tuple[PushQueue, float]] = OrderedDict()   # address -> (queue, last use)

    def __len__(self) -> int:
        return len(self.links)

    def get(self, address: str) -> PushQueue:
        if address in self.links:
            q = self.links.pop(address)[0]
        else:
            q = push_queue(address, name=f"{self.role}->{address}")
            while len(self.links) >= self.max_links:
                self.links.popitem(last=False)[1][0].close()
        self.links[address] = (q, time.monotonic())
        return q

    def reap(self) -> None:
        now = time.monotonic()
        while self.links:
            address, (q, used) = next(iter(self.links.items()))
            if now - used < self.idle_s:
                return
            del self.links[address]
            q.close()

    def close(self) -> None:
        for q, _ in self.links.values():
            q.close(wait=1.0)
        self.links.clear()
