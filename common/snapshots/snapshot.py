"""One snapshot of the store (store.py): where it ends, the KV blocks it shares, and what it keeps
of its own: the recurrent state, the last logits and the KV of the tail past its last full block."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Snapshot:
    pos: int
    base: bytes                          # chain key of the last full block (ROOT if none)
    blocks: list[bytes]                  # chain keys of the full blocks, in order
    recurrent: list[np.ndarray] | None   # conv..., ssm... (None while only on disk)
    logits: np.ndarray | None            # [vocab] logits of the last token
    tail_k: list[np.ndarray] = field(default_factory=list)   # per full layer: kv_shape(tail, ...) in kv_type
    tail_v: list[np.ndarray] = field(default_factory=list)
    rope_delta: int = 0                  # the state's (common.state)

    @property
    def ram_bytes(self) -> int:
        if self.recurrent is None:
            return 0
        return sum(a.nbytes for a in [*self.recurrent, self.logits, *self.tail_k, *self.tail_v])
