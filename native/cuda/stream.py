"""Streaming of routed experts, the dense FFNs that are not resident (qwen35) and a non-resident LM
head through the device slot.

The slot is a ring of `regions` equal regions. Each chunk of experts goes to the next region
on the copy stream, after the compute stream has released that region (an event); the
compute stream waits on the chunk's copy event before its GEMMs. Within a region a chunk is
laid out [gate experts | up experts | down experts], so runs of consecutive experts are one
copy each. `Timeline` collects event pairs for the copy and compute totals.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import DENSE_FFN_TENSORS, EXPERT_TENSORS, StreamPlan


class Timeline:
    """Pairs of events around work on one stream; summed after the stream is synchronised."""

    def __init__(self, cuda):
        self.cuda, self.spans = cuda, []

    def begin(self, stream):
        ev = self.cuda.Event()
        ev.record(stream)
        return ev

    def end(self, stream, start) -> None:
        ev = self.cuda.Event()
        ev.record(stream)
        self.spans.append((start, ev))

    def seconds(self) -> float:
        total = sum(end.time_since(start) for start, end in self.spans) / 1e3
        self.spans.clear()
        return total


@dataclass(frozen=True)
class Placement:
    region: int
    addr: dict[str, int]      # tensor -> device address of the chunk's first expert


def runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """Consecutive runs in sorted ids: (first id, end id, position of first in ids)."""
    if len(ids) == 0:
        return []
    breaks = np.nonzero(np.diff(ids) != 1)[0] + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(ids)]])
    return [(int(ids[s]), int(ids[e - 1]) + 1, int(s)) for s, e in zip(starts, ends)]


class ExpertStreamer:
    def __init__(self, cuda, arena, plan: StreamPlan, host, model):
        self.cuda, self.plan, self.host = cuda, plan, host
        self.copy = cuda.Stream()
        self.slot = arena.alloc("expert slot", plan.slot_bytes) if plan.slot_bytes else 0
        self.region_bytes, self.regions = plan.region_bytes, plan.regions
        self.free = [None] * self.regions
        self.next = 0
        self.copies = Timeline(cuda)
        self.h2d_bytes = 0
        cfg = model.config
        # (layer, tensor) -> bytes of one expert (none in a dense model)
        self.ebytes = {(i, t): model.tensor(f"blk.{i}.{t}.weight").raw[0].nbytes
                       for i in range(cfg.n_layers if cfg.n_experts else 0) for t in EXPERT_TENSORS}

    def expert_bytes(self, layer: int) -> int:
        return sum(self.ebytes[(layer, t)] for t in EXPERT_TENSORS)

    def chunks(self, layer: int, streamed: np.ndarray) -> list[np.ndarray]:
        """Split routed non-resident experts (sorted) into chunks that fit one region."""
        per = max(1, self.region_bytes // self.expert_bytes(layer))
        return [streamed[i:i + per] for i in range(0, len(streamed), per)]

    def place(self, layer: int, chunks: list[np.ndarray]) -> list[Placement]:
        """Regions and addresses the chunks will get, in issue order (round robin)."""
        out = []
        for c, experts in enumerate(chunks):
            region = (self.next + c) % self.regions
            addr, off = {}, self.slot + region * self.region_bytes
            for t in EXPERT_TENSORS:
                addr[t] = off
                off += len(experts) * self.ebytes[(layer, t)]
            out.append(Placement(region, addr))
        return out

    def _claim(self, region: int):
        if self.free[region] is not None:
            self.copy.wait_for_event(self.free[region])
        self.next = (region + 1) % self.regions
        return self.copies.begin(self.copy)

    def _done(self, start):
        self.copies.end(self.copy, start)
        return self.copies.spans[-1][1]

    def issue(self, layer: int, experts: np.ndarray, where: Placement):
        """Copy one chunk into its region; returns the event that marks it arrived."""
        start = self._claim(where.region)
        P = self.plan.pinned_experts
        for t in EXPERT_TENSORS:
            src, eb = self.host.src[(layer, t)], self.ebytes[(layer, t)]
            for first, end, at in runs(experts):
                self.cuda.memcpy_htod_async(where.addr[t] + at * eb, src[first - P:end - P], self.copy)
                self.h2d_bytes += (end - first) * eb
        return self._done(start)

    def issue_ffn(self, layer: int, offsets: tuple[int, ...]):
        """Copy one layer's dense FFN into the next region, each tensor at its offset (plan.ffn_offsets);
        returns (region, tensor -> device address, the event that marks it arrived)."""
        region = self.next
        start = self._claim(region)
        base, addr = self.slot + region * self.region_bytes, {}
        for t, off in zip(DENSE_FFN_TENSORS, offsets):
            src = self.host.src[(layer, t)]
            self.cuda.memcpy_htod_async(base + off, src, self.copy)
            self.h2d_bytes += src.nbytes
            addr[t] = base + off
        return region, addr, self._done(start)

    def upload(self, dst: int, src: np.ndarray):
        """A small table on the copy stream, so that it is not queued behind chunks issued after it."""
        self.cuda.memcpy_htod_async(dst, src, self.copy)
        ev = self.cuda.Event()
        ev.record(self.copy)
        return ev

    def issue_rows(self, src: np.ndarray):
        """Copy rows of a 2-D host array (a slice of the LM head) into the next region."""
        region = self.next
        start = self._claim(region)
        addr = self.slot + region * self.region_bytes
        self.cuda.memcpy_htod_async(addr, src, self.copy)
        self.h2d_bytes += src.nbytes
        return region, addr, self._done(start)

    def release(self, region: int, compute) -> None:
        ev = self.cuda.Event()
        ev.record(compute)
        self.free[region] = ev
