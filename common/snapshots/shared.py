"""The snapshot store's methods for its shared tier (redis_tier.py): bring a longer prefix into RAM."""
from __future__ import annotations

from typing import Sequence

from .keys import Marks
from .redis_tier import Record


class SharedTierMethods:
    """Mixed into SnapshotStore (store.py), whose lock, index and RAM tier these use."""

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
        from .store import Snapshot  # store.py imports this module
        self._index(r.key, Snapshot(r.pos, r.base, r.blocks, r.recurrent, r.logits, r.tail_k, r.tail_v, r.rope_delta))
        self._evict()
        return r.key in self.snaps and self.snaps[r.key].recurrent is not None
