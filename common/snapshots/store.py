"""Position-indexed snapshots of sequence state, with shared KV blocks, a RAM budget, a disk tier
and a shared tier (redis_tier.py) that several routers read and write.

A snapshot at position p holds the recurrent state (conv + Gated DeltaNet per linear layer) and
the logits of token p-1, and refers to the KV blocks of the full-attention layers up to p:
`block` tokens per block, keyed by the hash chain (keys.py), shared by every snapshot with that
prefix. The tokens past the last full block (the tail) keep their KV inside the snapshot. KV
stays in the store's cache type (--kv-type, common.kv_cache) in RAM and on disk.

Lookup walks the query's chain: at each known block it tries the tail lengths stored under that
block, so a hit can end at any position, not only at block boundaries. A prompt with images keys
each image's content too (`marks`, keys.py), and its snapshots keep the state's rope_delta.

RAM is the first tier; the local disk (disk_tier.py) and the shared store are both behind it. A
put goes to RAM, and onto the write queues of the disk tier and of the shared tier (a thread
each), so the caller (the router's event loop) never waits for either. `prefetch`, run off the
event loop before a request's lookup, brings a longer prefix from the shared tier into RAM.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..kv_cache import check_kv_type, check_same_kv_type
from ..model.config import ModelConfig
from ..state import SequenceState
from . import disk
from .disk_tier import DiskTierMethods
from .disk_writer import DiskWriter
from .keys import ROOT, Marks, chain, marks_in, prefix_key, tail_key
from .parts import KvParts
from .redis_tier import Record, RedisTier
from .snapshot import Snapshot

log = logging.getLogger("fermium.snapshots")


@dataclass
class StoreStats:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    evictions: int = 0
    disk_rejected: int = 0


KV_BLOCK = 64   # tokens per shared KV block, the unit of the key chain (keys.py)


class SnapshotStore(DiskTierMethods):
    """Thread-safe. `budget_bytes` bounds RAM (snapshots plus KV blocks), `disk_budget` the disk
    tier's files (0: no bound); least recently used goes first. It holds states with KV in
    `kv_type` only: a file of another type is corrupt to it. `events(name)` is told of each
    disk_writer.DISK_EVENTS."""

    def __init__(self, cfg: ModelConfig, budget_bytes: int, block: int = KV_BLOCK, disk_dir: str | Path | None = None,
                 kv_type: str = "f32", shared: RedisTier | None = None, disk_budget: int = 0,
                 events: Callable[[str], None] = lambda name: None):
        self.cfg, self.budget, self.block = cfg, budget_bytes, block
        self.kv_type = check_kv_type(kv_type, cfg.head_dim)
        self.snaps: OrderedDict[bytes, Snapshot] = OrderedDict()       # key -> snapshot, LRU order
        self.tails: dict[bytes, set[int]] = {}                         # base -> tail lengths stored
        self.kv_blocks: dict[bytes, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.refs: dict[bytes, int] = {}                               # block key -> snapshots using it
        self.known_blocks: set[bytes] = set()                          # chain keys on any path, RAM or disk
        self.stats = StoreStats()
        self.lock = threading.RLock()
        self.shared = shared                                           # the tier other routers see too
        self.disk_dir = Path(disk_dir) if disk_dir else None
        self.disk_budget, self.events = disk_budget, events
        self.on_disk: OrderedDict[bytes, int] = OrderedDict()            # key -> file size, LRU order
        self.disk_total = 0
        self.disk_writer: DiskWriter | None = None
        if self.disk_dir:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            disk.clean_orphans(self.disk_dir)
            self._index_disk()
            self.disk_writer = DiskWriter(self._disk_written, events)

    # ---- sizes
    @property
    def ram_bytes(self) -> int:
        kv = sum(a.nbytes for ks, vs in self.kv_blocks.values() for a in (*ks, *vs))
        return kv + sum(s.ram_bytes for s in self.snaps.values())

    # ---- put
    def put(self, tokens: Sequence[int], state: SequenceState, logits: np.ndarray, marks: Marks = (),
            owned: bool = False) -> bytes:
        """Store the state after `tokens` (state.pos == len(tokens)), whose images start where
        `marks` say (keys.py). Returns the snapshot key. `owned`: the caller hands over the
        recurrent arrays and the logits, each a whole array that nothing writes to again (a
        message's): kept as they are, with no copy on the caller's thread."""
        keep = (lambda a: a) if owned else (lambda a: a.copy())
        check_same_kv_type(state.kv_type, self.kv_type, "the state", "this snapshot store")
        n_lin = len(state.conv)
        return self.put_parts(tokens, KvParts.cut(state.pos, state.k, state.v, self.block),
                              [keep(a) for a in state.arrays()[:2 * n_lin]], keep(np.asarray(logits, np.float32)),
                              marks, int(state.rope_delta), owned_kv=False)

    def put_parts(self, tokens: Sequence[int], parts: KvParts, recurrent: list[np.ndarray], logits: np.ndarray,
                  marks: Marks = (), rope_delta: int = 0, owned_kv: bool = True) -> bytes:
        """Store the state after `tokens` whose KV is `parts` (cut in this store's blocks) and whose
        recurrent arrays and logits are handed over as they are. A block the store holds already is
        kept, and takes the place of the parts' own in `parts` (the caller then holds no second
        copy); one it lacks is taken, as it is when `owned_kv`, else copied. Returns the snapshot key."""
        if parts.pos != len(tokens):
            raise ValueError(f"state is at {parts.pos}, tokens are {len(tokens)}")
        B = self.block
        blocks = list(chain(tokens, B, marks))
        if len(blocks) != len(parts.blocks):
            raise ValueError(f"{len(parts.blocks)} KV blocks of {B} rows for {len(tokens)} tokens")
        keep = (lambda a: a) if owned_kv else (lambda a: a.copy())
        base = blocks[-1] if blocks else ROOT
        key = tail_key(base, tokens[len(blocks) * B:], marks_in(marks, len(blocks) * B, len(tokens)))
        with self.lock:
            if key in self.snaps:
                if self.snaps[key].recurrent is not None:
                    self.snaps.move_to_end(key)
                    parts.blocks[:] = [self.kv_blocks[b] for b in blocks]
                    return key
                self._forget(key)                 # only on disk, maybe damaged: write it anew
            for i, bkey in enumerate(blocks):
                if bkey not in self.kv_blocks:
                    ks, vs = parts.blocks[i]
                    self.kv_blocks[bkey] = ([keep(k) for k in ks], [keep(v) for v in vs])
                parts.blocks[i] = self.kv_blocks[bkey]
                self.refs[bkey] = self.refs.get(bkey, 0) + 1
            snap = Snapshot(parts.pos, base, blocks, recurrent, logits, [keep(k) for k in parts.tail_k],
                            [keep(v) for v in parts.tail_v], int(rope_delta))
            self._index(key, snap)
            if self.disk_writer:                  # queued: the writer thread writes it
                self._queue_write(key, snap, blocks)
            if self.shared:                       # queued: the writer thread sends it
                self.shared.put(Record(key, snap.pos, base, blocks, snap.recurrent, snap.logits, snap.tail_k,
                                       snap.tail_v, snap.rope_delta, {b: self.kv_blocks[b] for b in blocks}))
            self._evict()
            return key

    def parts(self, tokens: Sequence[int], marks: Marks = ()) -> KvParts | None:
        """The KV of the snapshot after exactly `tokens`, its blocks the store's own arrays (not
        copied); None when it is not in RAM."""
        with self.lock:
            snap = self.snaps.get(prefix_key(tokens, self.block, marks))
            if snap is None or snap.recurrent is None:
                return None
            return KvParts(snap.pos, [self.kv_blocks[b] for b in snap.blocks], list(snap.tail_k), list(snap.tail_v))

    def _index(self, key: bytes, snap: Snapshot) -> None:
        self.snaps[key] = snap
        self.tails.setdefault(snap.base, set()).add(snap.pos - len(snap.blocks) * self.block)
        self.known_blocks.update(snap.blocks)

    # ---- lookup
    def lookup(self, tokens: Sequence[int], marks: Marks = ()) -> tuple[SequenceState, np.ndarray] | None:
        """The state after the longest stored prefix of `tokens` (with the images `marks` says)
        and its last logits, or None."""
        with self.lock:
            self.stats.lookups += 1
            found = None
            while found is None and (best := self._longest(tokens, marks)) is not None:
                found = self._materialise(best)   # None: its file was corrupt and is gone; try the next
            if found is None:
                self.stats.misses += 1
                return None
            self.stats.hits += 1
            self.stats.tokens_saved += found[0].pos
            return found

    def _longest(self, tokens: Sequence[int], marks: Marks) -> bytes | None:
        B, best, best_pos = self.block, None, -1
        bases = [ROOT]
        for bkey in chain(tokens, B, marks):
            if bkey not in self.known_blocks:
                break
            bases.append(bkey)
        for j, base in enumerate(bases):
            for tail in self.tails.get(base, ()):
                pos = j * B + tail
                if pos > len(tokens) or pos <= best_pos:
                    continue
                key = tail_key(base, tokens[j * B:pos], marks_in(marks, j * B, pos))
                if key in self.snaps:
                    best, best_pos = key, pos
        return best

    def _materialise(self, key: bytes) -> tuple[SequenceState, np.ndarray] | None:
        snap = self.snaps[key]
        if snap.recurrent is None and not self._load_from_disk(key):
            return None
        self.snaps.move_to_end(key)
        self._touch(key)
        n_lin = len(snap.recurrent) // 2
        ks = [np.concatenate([*(self.kv_blocks[b][0][i] for b in snap.blocks), snap.tail_k[i]])
              for i in range(len(snap.tail_k))]
        vs = [np.concatenate([*(self.kv_blocks[b][1][i] for b in snap.blocks), snap.tail_v[i]])
              for i in range(len(snap.tail_v))]
        state = SequenceState(snap.pos, [a.copy() for a in snap.recurrent[:n_lin]],
                              [a.copy() for a in snap.recurrent[n_lin:]], ks, vs, self.kv_type, snap.rope_delta)
        return state, snap.logits.copy()

    # ---- the shared tier
    def prefetch(self, tokens: Sequence[int], marks: Marks = ()) -> int:
        """Bring the shared tier's snapshot of the longest prefix of `tokens` into RAM, when it is
        longer than what the local tiers hold, else the disk tier's (disk_tier.load_ahead), so
        that lookup finds it there. Blocks on the store and the disk: call it off the event loop.
        Returns the position brought in from the shared tier, 0 for none."""
        if self.shared is None:
            return self.load_ahead(tokens, marks) if self.disk_dir else 0
        with self.lock:
            best = self._longest(tokens, marks)
            local = self.snaps[best].pos if best is not None else -1
        found = None
        if local < len(tokens):                   # else the local tiers hold the whole prompt
            found = self.shared.fetch(tokens, marks, local, lambda bkey: bkey in self.kv_blocks)
        if found is not None:
            with self.lock:
                if self._adopt(found):
                    return found.pos
        if self.disk_dir:
            self.load_ahead(tokens, marks)        # the local disk's is the longest: into RAM too
        return 0

    def _adopt(self, r: Record) -> bool:
        """Index a snapshot from the shared tier in RAM; False when a block it counted on left RAM meanwhile."""
        if r.key in self.snaps and self.snaps[r.key].recurrent is not None:
            return True
        if any(b not in self.kv_blocks and b not in r.kv for b in r.blocks):
            return False
        if r.key in self.snaps:
            self._forget(r.key)
        for bkey in r.blocks:
            if bkey not in self.kv_blocks:
                self.kv_blocks[bkey] = r.kv[bkey]
            self.refs[bkey] = self.refs.get(bkey, 0) + 1
        self._index(r.key, Snapshot(r.pos, r.base, r.blocks, r.recurrent, r.logits, r.tail_k, r.tail_v, r.rope_delta))
        self._evict()
        return r.key in self.snaps and self.snaps[r.key].recurrent is not None

    # ---- eviction
    def _evict(self) -> None:
        while self.ram_bytes > self.budget:
            victim = next((k for k, s in self.snaps.items() if s.recurrent is not None), None)
            if victim is None:
                return
            self._drop_from_ram(victim)
            self.stats.evictions += 1

    def _drop_from_ram(self, key: bytes) -> None:
        snap = self.snaps[key]
        for bkey in snap.blocks:
            self.refs[bkey] -= 1
            if self.refs[bkey] == 0:
                del self.refs[bkey], self.kv_blocks[bkey]
        if key in self.on_disk:
            snap.recurrent = snap.logits = None                     # keep the index entry: it is on disk
            snap.tail_k, snap.tail_v = [], []
        else:
            self._forget(key)

    def _forget(self, key: bytes) -> None:
        snap = self.snaps.pop(key)
        self.tails[snap.base].discard(snap.pos - len(snap.blocks) * self.block)
