"""Which streamed experts of a layer cross the bus, where they land in the slot ring, and when.

A layer's plan is the list of chunks (experts that fit one ring region each), their places,
the events that mark each chunk arrived, and the layer's expert address table (`woff`: the
device address of each expert's first row, by tensor), which goes up on the copy stream ahead
of the chunks. When nearly every expert will be routed (long prompts), the next layer's plan is
issued as soon as this layer's GEMMs are queued, so its copies run under its mixer instead of
waiting for its routing counts; otherwise a layer streams only the experts it routed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import EXPERT_TENSORS
from .stream import Placement

PREFETCH_UNROUTED = 0.1     # stream all experts ahead when at most this share is expected unrouted


@dataclass
class LayerExperts:
    chunks: list[np.ndarray]
    places: list[Placement]
    ready: dict            # chunk index -> event: its copy has arrived (the rest are issued later)
    tables: object         # event: the address table has arrived
    woff: int              # device address of the table: int64 [3, E]

    def arrived(self) -> int:
        """How many chunks, in order from the first, have arrived by now."""
        n = 0
        while n in self.ready and self.ready[n].query():
            n += 1
        return n


class ExpertSchedule:
    def __init__(self, cuda, cfg, streamer, weights, host_tables: np.ndarray, device_tables: int):
        self.cuda, self.cfg, self.st, self.w = cuda, cfg, streamer, weights
        self.host, self.device = host_tables, device_tables      # int32 [2, 6E] pinned; 2 x int64 [3, E]
        self.pending: dict[int, LayerExperts] = {}
        self.done = [None, None]        # per table buffer: compute has finished with its last layer

    def expected_unrouted(self, T: int) -> float:
        """Share of experts no token picks, for T tokens picking top-k of E uniformly."""
        return (1.0 - self.cfg.n_experts_used / self.cfg.n_experts) ** T

    def prefetch(self, i: int, T: int) -> None:
        """Issue layer i's copies of every streamed expert now, if nearly all will be routed."""
        if i in self.pending or i >= self.cfg.n_layers or self.expected_unrouted(T) > PREFETCH_UNROUTED:
            return
        self.pending[i] = self._issue(i, np.arange(self.st.plan.pinned_experts, self.cfg.n_experts))

    def take(self, i: int, counts: np.ndarray) -> LayerExperts:
        """Layer i's plan once its counts are known: the prefetched one, or one for its routed experts."""
        got = self.pending.pop(i, None)
        if got is None:
            used = np.nonzero(counts)[0]
            got = self._issue(i, used[used >= self.st.plan.pinned_experts])
        return got

    def finished(self, i: int, compute) -> None:
        """Compute has queued everything that reads layer i's table."""
        ev = self.cuda.Event()
        ev.record(compute)
        self.done[i % 2] = ev

    def _issue(self, i: int, streamed: np.ndarray) -> LayerExperts:
        E, P, st = self.cfg.n_experts, self.st.plan.pinned_experts, self.st
        chunks = st.chunks(i, streamed)
        places = st.place(i, chunks)
        woff = np.zeros((3, E), np.int64)
        for j, t in enumerate(EXPERT_TENSORS):
            eb = st.ebytes[(i, t)]
            if P:
                woff[j, :P] = self.w.experts[(i, t)].ptr + np.arange(P) * eb
            for experts, where in zip(chunks, places):
                woff[j, experts] = where.addr[t] + np.arange(len(experts)) * eb
        b = i % 2                       # two tables: the next layer's goes up while this one's is read
        self.host[b] = woff.reshape(-1).view(np.int32)
        device = self.device + b * 3 * E * 8
        if self.done[b] is not None:
            st.copy.wait_for_event(self.done[b])
        tables = st.upload(device, self.host[b])
        ready = {c: st.issue(i, chunks[c], places[c]) for c in range(min(len(chunks), st.regions))}
        return LayerExperts(chunks, places, ready, tables, device)
