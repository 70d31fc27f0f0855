"""A state's KV as the snapshot store keeps it: whole blocks of `block` rows, each shared by every
snapshot with that prefix, and the rows past the last whole block (the tail).

The router follows a prefill's Snapshots with one KvParts per request (services/router/
snapshot_chains.py): each Snapshot brings only the rows past the previous one, which `extend` adds,
cutting the new whole blocks out of them; the blocks before stay the arrays they were, never
copied nor sent again. Every array here is whole or a view that nothing writes to.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Block = tuple[list[np.ndarray], list[np.ndarray]]    # (k, v) per full layer: (block, kv_heads, width) each


@dataclass
class KvParts:
    pos: int                     # rows in all: len(blocks) * block + tail rows
    blocks: list[Block]
    tail_k: list[np.ndarray]     # per full layer: (pos - len(blocks) * block, kv_heads, width)
    tail_v: list[np.ndarray]

    @classmethod
    def empty(cls) -> "KvParts":
        """Nothing yet: the layers come with the first rows."""
        return cls(0, [], [], [])

    @classmethod
    def cut(cls, pos: int, k: list[np.ndarray], v: list[np.ndarray], block: int) -> "KvParts":
        """Whole K and V arrays of `pos` rows (per full layer) as views of their blocks and tail."""
        n = pos // block
        blocks = [([a[i * block:(i + 1) * block] for a in k], [a[i * block:(i + 1) * block] for a in v])
                  for i in range(n)]
        return cls(pos, blocks, [a[n * block:] for a in k], [a[n * block:] for a in v])

    def check_rows(self, k: list[np.ndarray], v: list[np.ndarray], rows: int) -> None:
        """ValueError unless `k` and `v` are `rows` rows of every full layer, shaped as the rows already held."""
        known = bool(self.pos)                   # else the first rows say how many layers, of what shape
        if len(k) != len(v) or (known and len(k) != len(self.tail_k)):
            raise ValueError(f"{len(k)} K and {len(v)} V arrays for "
                             f"{len(self.tail_k) if known else len(k)} full-attention layers")
        for i, (a, b) in enumerate(zip(k, v)):
            like = self.tail_k[i] if known else a
            if a.ndim != 3 or a.shape[0] != rows or a.shape[1:] != like.shape[1:] or a.dtype != like.dtype:
                raise ValueError(f"k[{i}] is {a.dtype}{list(a.shape)}, {rows} rows of "
                                 f"{like.dtype}{list(like.shape[1:])} are needed")
            if b.shape != a.shape or b.dtype != a.dtype:
                raise ValueError(f"v[{i}] is {b.dtype}{list(b.shape)}, k[{i}] is {a.dtype}{list(a.shape)}")

    def extend(self, k: list[np.ndarray], v: list[np.ndarray], rows: int, block: int) -> "KvParts":
        """These parts followed by `rows` rows `k` and `v` (check_rows first); this KvParts stays as it was."""
        ks = [np.concatenate([t, a]) for t, a in zip(self.tail_k, k)] if self.pos else list(k)
        vs = [np.concatenate([t, a]) for t, a in zip(self.tail_v, v)] if self.pos else list(v)
        start = len(self.blocks) * block
        new = KvParts.cut(self.pos + rows - start, ks, vs, block)
        # the tail is copied out so that it does not hold on to the new blocks' buffer after they go
        return KvParts(self.pos + rows, self.blocks + new.blocks, [a.copy() for a in new.tail_k],
                       [a.copy() for a in new.tail_v])

    def arrays(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Whole K and V per full layer (copies): a state's, as SequenceState holds them."""
        return ([np.concatenate([*(b[0][i] for b in self.blocks), t]) for i, t in enumerate(self.tail_k)],
                [np.concatenate([*(b[1][i] for b in self.blocks), t]) for i, t in enumerate(self.tail_v)])
