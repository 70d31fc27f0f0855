"""The seams between the servers and what computes for them, as Protocols: a `Runner` (decode,
the `cpu` prefill backend and `fermium generate` run the model on one), a `SpeculativeRunner`
(one that also verifies and drafts for --speculative mtp, common/speculative.py) and a
`PrefillBackend` (what services/prefill/server.py prefills through). common/engines.py names
every class that provides them; tests/test_engines.py checks each against its Protocol.

Shapes: `tokens` are token ids; `decode` returns logits (B, vocab), one row per state; `prefill`
the last token's logits (vocab,), or every token's (T, vocab) with `all_logits`. Both advance the
states in place; every state keeps its KV cache in the runner's `kv_type` (common.kv_cache).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from common.model.config import ModelConfig
from common.reference.multimodal import MropeInput
from common.state import Checkpoint, DraftState, RollbackSlots, SequenceState


@runtime_checkable
class Runner(Protocol):
    cfg: ModelConfig
    kv_type: str

    def new_state(self) -> SequenceState: ...

    def prefill(self, tokens: Sequence[int], state: SequenceState, *, chunk: int = ...,
                all_logits: bool = False, mm: MropeInput | None = None) -> np.ndarray: ...

    def decode(self, tokens: Sequence[int], states: list[SequenceState]) -> np.ndarray: ...


@runtime_checkable
class SpeculativeRunner(Runner, Protocol):
    """A runner with the MTP block's methods: verify a batch's drafts in one step, keep the
    accepted rows (rollback slots hold the recurrent state after each row), draft the next ones."""

    @property
    def has_mtp(self) -> bool: ...

    def new_rollback(self, slots: int) -> RollbackSlots: ...

    def rollback_bytes(self, slots: int) -> int: ...

    def new_draft_state(self) -> DraftState: ...

    def draft_state_bytes(self, positions: int) -> int: ...

    def verify(self, tokens: list[list[int]], states: list[SequenceState],
               rollbacks: list[RollbackSlots | None]) -> tuple[np.ndarray, np.ndarray]: ...

    def keep(self, state: SequenceState, rollback: RollbackSlots | None, rows: int, ran: int) -> None: ...

    def set_draft_vocab(self, ids: np.ndarray | None) -> None: ...

    def draft(self, tokens: list[list[int]], hidden: np.ndarray, dstates: list[DraftState],
              last_only: bool = False) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class PrefillBackend(Protocol):
    """`prefill_with_checkpoints`: prefill's last logits and the states at `checkpoints` (positions
    strictly inside the call, increasing), captured in the same passes over the weights,
    `progress()` called per chunk or pass. `stats()`: cumulative numbers that the prefill service
    exports as metrics (`passes`: the passes over the weights, of the backend's own size)."""

    name: str
    kv_type: str

    def prefill(self, tokens: Sequence[int], state: SequenceState, *, all_logits: bool = False,
                mm: MropeInput | None = None) -> np.ndarray: ...

    def prefill_with_checkpoints(self, tokens: Sequence[int], state: SequenceState, checkpoints: Sequence[int], *,
                                 mm: MropeInput | None = None, progress: Callable[[], None] | None = None
                                 ) -> tuple[np.ndarray, list[Checkpoint]]: ...

    def stats(self) -> dict[str, Any]: ...
