"""What a worker plans its memory by: one sequence's state at a number of tokens (the context
size, common.config.context_size), in the KV cache type it keeps (common.kv_cache), and the
model file's bytes; common.config.check_memory and common/file_types.py weigh them against the RAM."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.model.config import ModelConfig

MIB = 2 ** 20


def size_text(n: int) -> str:
    """Bytes as GiB (two decimals), or MiB below 1 GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / MIB:.1f} MiB"


@dataclass(frozen=True)
class SequenceMemory:
    """What one sequence's state (common.state.SequenceState) holds at `tokens` positions."""

    tokens: int
    kv_bytes: int                # the full-attention layers' K and V up to `tokens`
    recurrent_bytes: int         # the linear layers' conv tails and DeltaNet matrices: fixed
    kv_type: str = "f32"         # common.kv_cache.KV_TYPES
    # speculative decoding (common/speculative.py): the recurrent state's copies after each
    # verified row (fixed), and the MTP block's K and V up to `tokens`
    rollback_bytes: int = 0
    draft_kv_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.recurrent_bytes + self.rollback_bytes + self.draft_kv_bytes

    @property
    def fixed_bytes(self) -> int:
        """What does not grow with the context."""
        return self.recurrent_bytes + self.rollback_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return (self.kv_bytes + self.draft_kv_bytes) // self.tokens if self.tokens else 0

    def describe(self, batch: int) -> str:
        spec = (f" + speculation {(self.rollback_bytes + self.draft_kv_bytes) / MIB:.1f} MiB (rollback slots "
                f"{self.rollback_bytes / MIB:.1f} MiB, draft KV {self.draft_kv_bytes / MIB:.1f} MiB)"
                if self.rollback_bytes or self.draft_kv_bytes else "")
        return (f"context {self.tokens} tokens: up to {self.total_bytes / MIB:.1f} MiB per sequence (KV "
                f"{self.kv_type} {self.kv_bytes / MIB:.1f} MiB + recurrent state {self.recurrent_bytes / MIB:.1f} MiB"
                f"{spec}); batch of {batch}: {batch * self.total_bytes / 2**30:.2f} GiB")


def sequence_memory(cfg: "ModelConfig", tokens: int, kv_type: str = "f32", draft_tokens: int = 0) -> SequenceMemory:
    """The bytes of a SequenceState of this model at position `tokens` with KV in `kv_type` (its
    arrays' nbytes); with `draft_tokens` (speculative decoding), also its rollback slots (one
    copy of the recurrent state per draft: runner.rollback_bytes) and the MTP block's KV, one
    full-attention layer's (runner.draft_state_bytes)."""
    import numpy as np

    from common.kv_cache import kv_dtype, kv_shape
    from common.state import state_specs
    kv = rec = 0
    for name, dtype, shape in state_specs(tokens, cfg, kv_type):
        n = int(np.prod(shape)) * dtype.itemsize
        if name.startswith(("k[", "v[")):
            kv += n
        else:
            rec += n
    draft_kv = (2 * int(np.prod(kv_shape(tokens, cfg.n_kv_heads, cfg.head_dim, kv_type))) * kv_dtype(kv_type).itemsize
                if draft_tokens else 0)
    return SequenceMemory(tokens, kv, rec, kv_type, draft_tokens * rec, draft_kv)


def model_file_bytes(model: Any) -> int:
    """The size of the model's file (0 for a model with no file, as the in-process stack's)."""
    try:
        return os.path.getsize(model.path)
    except (OSError, TypeError, AttributeError):
        return 0
