"""Decode's links to the prefill workers that keep finished sequences' states (DecodeRequest
.hold_at): reused, at most MAX_HOLDERS of them (the least recently used is closed first), and one
unused for IDLE_HOLDER_S closed. On the compute loop only; the links' IO runs on their threads.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from common.mp import PushQueue
from common.mp_local import push_queue

MAX_HOLDERS = 8
IDLE_HOLDER_S = 120.0


class HolderLinks:
    def __init__(self, max_links: int = MAX_HOLDERS, idle_s: float = IDLE_HOLDER_S):
        self.max_links, self.idle_s = max_links, idle_s
        self.links: OrderedDict[str, tuple[PushQueue, float]] = OrderedDict()   # address -> (queue, last use)

    def get(self, address: str) -> PushQueue:
        if address in self.links:
            q = self.links.pop(address)[0]
        else:
            q = push_queue(address, name=f"decode->{address}")
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
