"""The router's side of a prefill's Snapshots. Each brings the recurrent state whole and, of the
KV, only the rows past the request's previous Snapshot (services/prefill/snapshot_rows.py); a
chain per request holds the KV so far (common/snapshots/parts.py), its blocks the snapshot
store's own arrays, so each Snapshot's whole state is assembled here and no block crosses the
wire twice. The end of the prompt's whole state is assembled only for the n > 1 copies (copies.py).

A chain begins when its PrefillRequest goes out, from the KV of the state the request starts
from (the prefix cache's start_parts), and ends with the prefill (PrefillDone, Failed, its
worker gone) or the request. A Snapshot that does not follow its chain — from another worker,
of another KV type, rows of the wrong count or shape, a `since` other than where the chain ends,
a `pos` past the prompt, an unknown request — is refused with the reason (SnapshotRefused),
logged at a bounded rate, and the chain stays as it was. One of a request that ended lately (its
prefill ran on past a cancel) is dropped quietly.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.kv_cache import kv_dtype
from common.protocol.router import Snapshot
from common.snapshots import KV_BLOCK
from common.snapshots.parts import KvParts
from common.worker import CancelledIds


class SnapshotRefused(ValueError):
    """A Snapshot that cannot be assembled; `late`: its request ended here lately."""

    def __init__(self, why: str, late: bool = False):
        super().__init__(why)
        self.late = late


@dataclass
class Chain:
    worker_id: str               # the prefill worker the request went to
    end: int                     # the prompt's length
    kv_type: str
    parts: KvParts               # the KV up to the last Snapshot (at first: the start state's)


class SnapshotChains:
    def __init__(self, block: int = KV_BLOCK):
        self.block = block
        self._chains: dict[str, Chain] = {}
        self._ended = CancelledIds()

    def begin(self, rid: str, worker_id: str, end: int, kv_type: str, parts: KvParts) -> None:
        self._chains[rid] = Chain(worker_id, end, kv_type, parts)

    def extend(self, msg: Snapshot) -> KvParts:
        """The KV of the state msg brings: its chain's, then its rows (SnapshotRefused when it does not follow)."""
        chain = self._chains.get(msg.rid)
        if chain is None:
            late = msg.rid in self._ended
            raise SnapshotRefused("its request ended" if late else "no prefill of its request is in flight here",
                                  late)
        if msg.worker_id != chain.worker_id:
            raise SnapshotRefused(f"the request went to {chain.worker_id}, not to {msg.worker_id:.40}")
        if msg.kv_type != chain.kv_type:
            raise SnapshotRefused(f"its KV type is {msg.kv_type!r:.20}, the router's {chain.kv_type!r}")
        if msg.since != chain.parts.pos:
            raise SnapshotRefused(f"its KV rows start at {msg.since}, the request's previous state ends at "
                                  f"{chain.parts.pos}")
        if not chain.parts.pos < msg.pos <= chain.end:
            raise SnapshotRefused(f"position {msg.pos} does not follow {chain.parts.pos} within the prompt of "
                                  f"{chain.end} tokens")
        try:
            chain.parts.check_rows(msg.k, msg.v, msg.pos - msg.since)
        except ValueError as e:
            raise SnapshotRefused(str(e)) from None
        want = kv_dtype(chain.kv_type)
        if any(a.dtype != want for a in msg.k):
            raise SnapshotRefused(f"its K and V are {msg.k[0].dtype}, KV type {chain.kv_type} is {want}")
        chain.parts = chain.parts.extend(msg.k, msg.v, msg.pos - msg.since, self.block)
        return chain.parts

    def end(self, rid: str) -> None:
        if self._chains.pop(rid, None) is not None:
            self._ended.add(rid)

    def drop_worker(self, worker_id: str) -> None:
        for rid in [rid for rid, c in self._chains.items() if c.worker_id == worker_id]:
            self.end(rid)

    def __contains__(self, rid: str) -> bool:
        return rid in self._chains

    def __len__(self) -> int:
        return len(self._chains)


class SnapshotIntake:
    """Mixed into the Dispatcher (dispatch.py), whose chains, copies, tracks, cache, placement and
    `_refusals` (a common.log_limit.LogLimiter) it uses."""

    def _snapshot(self, msg: Snapshot) -> None:
        try:
            parts = self.chains.extend(msg)
        except SnapshotRefused as e:
            if not e.late:
                if msg.rid in self.tracks:             # a worker of this router's that broke the protocol
                    self.metrics.protocol_error("invalid")
                self._refusals("router refused a Snapshot at %d (rid %.40s, from %.40s): %s", msg.pos, msg.rid,
                               msg.worker_id, e)
            return
        copies = self.copies.get(msg.rid)
        if copies is not None and msg.pos == len(copies.history):
            ks, vs = parts.arrays()
            self._send_copies(self.copies.pop(msg.rid), [*msg.recurrent, *ks, *vs], msg.logits, msg.rope_delta)
        track = self.tracks.get(msg.rid)
        if track is None:
            return
        key = self.cache.store_parts(track.prompt, parts, msg.recurrent, msg.logits, "prefill", msg.kv_type,
                                     track.marks, msg.rope_delta)
        if track.hold:
            self.placement.held_by(track.prefill, track.prompt, msg.pos, key)
