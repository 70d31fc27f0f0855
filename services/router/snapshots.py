"""The router's prefix cache: the snapshot store behind the dispatcher's PrefixCache seam.

Snapshots come back from prefill (every `interval` tokens and at the end of the prompt) and
from decode (at the end of a generation); a request starts from the longest stored prefix.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.model.config import ModelConfig
from common.snapshots import SnapshotStore
from common.state import SequenceState

log = logging.getLogger("fermium.router")


class SnapshotMetrics:
    """fermium_snapshot_{lookups,hits,misses,tokens_saved,evictions}_total and fermium_snapshot_bytes{tier}."""

    def __init__(self, registry: CollectorRegistry, store: SnapshotStore):
        self.store = store
        self.lookups = Counter("fermium_snapshot_lookups", "Prefix lookups", registry=registry)
        self.hits = Counter("fermium_snapshot_hits", "Lookups that found a stored prefix", registry=registry)
        self.misses = Counter("fermium_snapshot_misses", "Lookups that found nothing", registry=registry)
        self.tokens_saved = Counter("fermium_snapshot_tokens_saved",
                                    "Prompt tokens not prefilled thanks to a snapshot", registry=registry)
        self.evictions = Counter("fermium_snapshot_evictions", "Snapshots evicted from RAM", registry=registry)
        self.stored = Counter("fermium_snapshot_stored", "Snapshots stored", ("source",), registry=registry)
        for source in ("prefill", "decode"):
            self.stored.labels(source)
        self.bytes = Gauge("fermium_snapshot_bytes", "Bytes held by the snapshot store", ("tier",),
                           registry=registry)
        self.bytes.labels("ram").set_function(lambda: store.ram_bytes)
        self.bytes.labels("disk").set_function(lambda: store.disk_bytes)
        self._seen_evictions = 0

    def sync_evictions(self) -> None:
        new = self.store.stats.evictions - self._seen_evictions
        if new:
            self.evictions.inc(new)
            self._seen_evictions += new


class SnapshotCache:
    """PrefixCache over a SnapshotStore. A hit may cover the whole prompt: its logits then stand
    in for the prefill, and decode starts at once."""

    wants_final_state = True

    def __init__(self, cfg: ModelConfig, store: SnapshotStore, metrics: SnapshotMetrics, snapshot_every: int):
        self.cfg, self.store, self.metrics = cfg, store, metrics
        self.snapshot_every = snapshot_every

    def lookup(self, ids: Sequence[int]) -> tuple[int, list[np.ndarray] | None, np.ndarray | None]:
        """(start position, state arrays, logits at the start) — (0, None, None) on a miss."""
        self.metrics.lookups.inc()
        found = self.store.lookup(ids)
        if found is None:
            self.metrics.misses.inc()
            return 0, None, None
        state, logits = found
        self.metrics.hits.inc()
        self.metrics.tokens_saved.inc(state.pos)
        return state.pos, state.arrays(), logits

    def store_state(self, ids: Sequence[int], pos: int, arrays: list[np.ndarray],
                    logits: np.ndarray, source: str) -> None:
        """Keep the state after ids[:pos]; `logits` are those of token pos-1."""
        try:
            state = SequenceState.from_arrays(pos, list(arrays), self.cfg)
            self.store.put(list(ids[:pos]), state, logits)
        except (ValueError, OSError) as exc:
            log.error("snapshot at position %d not stored: %s", pos, exc)
            return
        self.metrics.stored.labels(source).inc()
        self.metrics.sync_evictions()


CHUNK = 64   # the prefill chunk: checkpoints and KV blocks align to it


def build_snapshot_cache(cfg: ModelConfig, registry: CollectorRegistry, budget: int,
                         disk_dir: str | None, every: int) -> SnapshotCache | None:
    if budget <= 0:
        return None
    if every < 0 or every % CHUNK:
        raise ValueError(f"snapshot interval {every} must be a multiple of the prefill chunk, {CHUNK} (0: only "
                         f"at prompt and generation ends)")
    store = SnapshotStore(cfg, budget, block=CHUNK, disk_dir=disk_dir)
    if store.stats.disk_rejected:
        log.error("%d corrupt snapshot files in %s were dropped", store.stats.disk_rejected, disk_dir)
    log.info("snapshots: %.1f GiB in RAM%s, checkpoint every %s tokens", budget / 2 ** 30,
             f", disk tier {disk_dir} ({len(store.snaps)} indexed)" if disk_dir else "", every or "-")
    return SnapshotCache(cfg, store, SnapshotMetrics(registry, store), every)
