"""The router's prefix cache: the PrefixCache seam the dispatcher looks prefixes up through,
NoPrefixCache (nothing cached), and the snapshot store behind it (SnapshotCache).

Snapshots come back from prefill (every `interval` tokens and at the end of the prompt) and
from decode (at the end of a generation); a request starts from the longest stored prefix.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from common.kv_cache import check_same_kv_type
from common.metrics import RouterMetrics
from common.model.config import ModelConfig
from common.reference.deltanet import PREFILL_CHUNK
from common.snapshots import KV_BLOCK, SnapshotStore
from common.snapshots.keys import Marks
from common.snapshots.parts import KvParts
from common.state import SequenceState, check_logits, check_rope_delta, check_state

log = logging.getLogger("fermium.router")


class PrefixCache(Protocol):
    wants_final_state: bool
    snapshot_every: int          # prefill checkpoints every this many tokens; 0: none

    # marks: a prompt's images (common/snapshots/keys.py); rope_delta: the state's (common.state)
    def lookup(self, ids: tuple[int, ...], marks: Marks = ()) -> tuple[int, list[np.ndarray] | None,
                                                                        np.ndarray | None]: ...
    def store_state(self, ids: tuple[int, ...], pos: int, arrays: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None: ...
    # a prefill's Snapshots (services/router/engine/snapshot_chains.py): the KV a request starts from, then each one's
    def start_parts(self, ids: tuple[int, ...], start: int, state: list[np.ndarray] | None,
                    marks: Marks = ()) -> KvParts: ...
    def store_parts(self, ids: tuple[int, ...], parts: KvParts, recurrent: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None: ...
    # a final state's rows follow the KV of a snapshot the store holds (services/router/engine/finals.py)
    def held_parts(self, ids: tuple[int, ...], marks: Marks = ()) -> KvParts | None: ...


class NoPrefixCache:
    """Nothing cached: every prompt is prefilled from position 0."""

    wants_final_state = False
    snapshot_every = 0

    def lookup(self, ids: tuple[int, ...], marks: Marks = ()) -> tuple[int, list[np.ndarray] | None,
                                                                        np.ndarray | None]:
        return 0, None, None

    def store_state(self, ids: tuple[int, ...], pos: int, arrays: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None:
        return None

    def start_parts(self, ids: tuple[int, ...], start: int, state: list[np.ndarray] | None,
                    marks: Marks = ()) -> KvParts:
        return KvParts.empty()                    # nothing is cached: every prefill starts at 0

    def store_parts(self, ids: tuple[int, ...], parts: KvParts, recurrent: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None:
        return None

    def held_parts(self, ids: tuple[int, ...], marks: Marks = ()) -> KvParts | None:
        return None


class SnapshotCache:
    """PrefixCache over a SnapshotStore. A hit may cover the whole prompt: its logits then stand
    in for the prefill, and decode starts at once."""

    wants_final_state = True

    def __init__(self, cfg: ModelConfig, store: SnapshotStore, metrics: RouterMetrics, snapshot_every: int):
        self.cfg, self.store, self.metrics = cfg, store, metrics
        self.snapshot_every = snapshot_every
        self._evictions_seen = 0
        metrics.snapshot_bytes.labels("ram").set_function(lambda: store.ram_bytes)
        metrics.snapshot_bytes.labels("disk").set_function(lambda: store.disk_bytes)
        metrics.disk_queue.set_function(lambda: store.disk_writer.pending if store.disk_writer else 0)

    async def prefetch(self, ids: Sequence[int], marks: Marks = ()) -> int:
        """Read the disk tier's file of the longest stored prefix of `ids` into RAM on a thread
        (disk_tier.load_ahead), so that lookup, on the event loop, does not read the disk. Never raises
        but for cancellation."""
        if self.store.disk_dir is None:
            return 0
        try:
            return await asyncio.to_thread(self.store.load_ahead, list(ids), marks)
        except Exception:
            log.exception("reading a snapshot from disk failed; lookup serves from RAM")
            return 0

    def lookup(self, ids: Sequence[int], marks: Marks = ()) -> tuple[int, list[np.ndarray] | None,
                                                                       np.ndarray | None]:
        """(start position, state arrays, logits at the start) — (0, None, None) on a miss. The
        state's rope_delta follows from the images before the start, which the caller knows."""
        self.metrics.snapshot_lookups.inc()
        try:
            found = self.store.lookup(ids, marks)
        except Exception:                         # a cache must never fail the request it would speed up
            log.exception("snapshot lookup failed; serving it cold")
            found = None
        if found is None:
            self.metrics.snapshot_misses.inc()
            return 0, None, None
        state, logits = found
        self.metrics.snapshot_hits.inc()
        self.metrics.snapshot_tokens_saved.inc(state.pos)
        return state.pos, state.arrays(), logits

    def store_state(self, ids: Sequence[int], pos: int, arrays: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None:
        """Keep the state after ids[:pos] (its images at `marks`), its KV in `kv_type` (the store's
        own, else refused); `logits` are those of token pos-1. The arrays are handed over (a message's,
        each whole): the store keeps them uncopied. Returns its snapshot key, None if refused."""
        def put() -> bytes:
            state = SequenceState.from_arrays(pos, list(arrays), self.cfg, self.store.kv_type, rope_delta)
            return self.store.put(list(ids[:pos]), state, logits, marks, owned=True)   # a message's arrays
        return self._stored(put, pos, source, kv_type)

    def start_parts(self, ids: Sequence[int], start: int, state: list[np.ndarray] | None,
                    marks: Marks = ()) -> KvParts:
        """The KV of the state after ids[:start] that a prefill starts from (`state`, None at 0): the
        store's blocks where it still holds that snapshot, else cut from `state`."""
        if not start:
            return KvParts.empty()
        parts = self.held_parts(ids[:start], marks)
        if parts is not None:
            return parts
        held = SequenceState.from_arrays(start, list(state), self.cfg, self.store.kv_type)
        return KvParts.cut(start, held.k, held.v, self.store.block)

    def held_parts(self, ids: Sequence[int], marks: Marks = ()) -> KvParts | None:
        """The KV of the snapshot after exactly `ids`, its blocks the store's own arrays; None when
        it is not in RAM."""
        return self.store.parts(list(ids), marks)

    def store_parts(self, ids: Sequence[int], parts: KvParts, recurrent: list[np.ndarray], logits: np.ndarray,
                    source: str, kv_type: str, marks: Marks = (), rope_delta: int = 0) -> bytes | None:
        """Keep the state after ids[:parts.pos] whose KV is `parts` (snapshot_chains.py) and whose
        recurrent arrays and logits are a message's, handed over; checked against the model first,
        its tail's rows for the shape of every row. Returns its snapshot key, None if refused."""
        def put() -> bytes:
            pos, tail = parts.pos, parts.tail_k[0].shape[0] if parts.tail_k else 0
            check_state(pos, [*recurrent, *parts.tail_k, *parts.tail_v], self.cfg, self.store.kv_type, pos - tail)
            check_rope_delta(pos, rope_delta)
            check_logits(logits, self.cfg)
            return self.store.put_parts(list(ids[:pos]), parts, list(recurrent), logits, marks, rope_delta)
        return self._stored(put, parts.pos, source, kv_type)

    def _stored(self, put, pos: int, source: str, kv_type: str) -> bytes | None:
        try:
            check_same_kv_type(kv_type, self.store.kv_type, f"the state from {source}", "the router")
            key = put()
        except (ValueError, OSError) as exc:
            log.error("snapshot at position %d not stored: %s", pos, exc)
            return None
        self.metrics.snapshot_stored.labels(source).inc()
        evicted, self._evictions_seen = self.store.stats.evictions - self._evictions_seen, self.store.stats.evictions
        self.metrics.snapshot_evictions.inc(evicted)
        return key


def model_folder(disk_dir: str | Path, model_id: str, kv_type: str) -> Path:
    """The disk tier of one model (GGUFModel.fingerprint) with KV in one type, inside --snapshot-dir."""
    return Path(disk_dir) / f"{model_id}-kv-{kv_type}"


def disk_events(metrics: RouterMetrics):
    """The disk tier's events (common/snapshots/disk_writer.py) as metric updates."""
    def event(name: str) -> None:
        if name == "evicted":
            metrics.disk_evictions.inc()
        else:
            metrics.disk_writes.labels(name).inc()
    return event


def build_snapshot_cache(cfg: ModelConfig, metrics: RouterMetrics, budget: int, disk_dir: str | None, every: int,
                         model_id: str = "", kv_type: str = "f32", disk_budget: int = 0) -> SnapshotCache | None:
    """`model_id` (GGUFModel.fingerprint) and `kv_type` name the disk tier's folder inside
    `disk_dir`, so models that share a --snapshot-dir never read each other's states, even at
    equal shapes, and a restart with another --kv-type does not see the other type's files."""
    if budget <= 0:
        return None
    if every < 0 or every % PREFILL_CHUNK:
        raise ValueError(f"snapshot interval {every} must be a multiple of the prefill chunk, {PREFILL_CHUNK} (0: only "
                         f"at prompt and generation ends)")
    if disk_dir and model_id:
        disk_dir = str(model_folder(disk_dir, model_id, kv_type))
    store = SnapshotStore(cfg, budget, block=KV_BLOCK, disk_dir=disk_dir, kv_type=kv_type, disk_budget=disk_budget,
                          events=disk_events(metrics))
    if store.stats.disk_rejected:
        log.error("%d corrupt snapshot files in %s were dropped", store.stats.disk_rejected, disk_dir)
    log.info("snapshots: %.1f GiB in RAM, KV in %s%s, checkpoint every %s tokens", budget / 2 ** 30, kv_type,
             f", disk tier {disk_dir} ({len(store.snaps)} indexed, {disk_budget / 2 ** 30:.1f} GiB)" if disk_dir
             else "", every or "-")
    return SnapshotCache(cfg, store, metrics, every)
