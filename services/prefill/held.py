"""The states a prefill worker keeps for later requests: a RAM LRU with a byte budget
(--held-budget), under the snapshot keys the router files them by (common/snapshots/keys.py
prefix_key of the tokens a state follows). Plain Python, on the compute loop only.

A request that asks `hold` has the worker keep the state it was sent and the ones it sends
back as Snapshots; decode sends it the final one (HoldState). A request that names a held state
starts from a copy of it (common.protocol.checks copies every start state), so the held one
stays as it was. A state larger than the whole budget is not kept. Only text prompts are held:
the keys of a prompt with images need their marks, which only the router has.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from common.snapshots import KV_BLOCK
from common.snapshots.keys import prefix_key
from common.state import SequenceState


class HeldStates:
    def __init__(self, budget: int, block: int = KV_BLOCK):
        self.budget, self.block = max(0, budget), block
        self._states: OrderedDict[str, SequenceState] = OrderedDict()   # hex key -> state, LRU order
        self.bytes = 0
        self.evictions = 0

    def put(self, tokens: Sequence[int], state: SequenceState) -> None:
        """Keep `state`, the state after `tokens`; it must not change while it is kept."""
        if state.pos != len(tokens):
            raise ValueError(f"the state is at {state.pos}, after {len(tokens)} tokens")
        if state.nbytes > self.budget:
            return
        key = prefix_key(tokens, self.block).hex()
        old = self._states.pop(key, None)
        self.bytes += state.nbytes - (old.nbytes if old is not None else 0)
        self._states[key] = state
        while self.bytes > self.budget:
            _, gone = self._states.popitem(last=False)
            self.bytes -= gone.nbytes
            self.evictions += 1

    def get(self, key: str, pos: int) -> SequenceState | None:
        """The state kept under `key`, at `pos`; None when none is."""
        state = self._states.get(key)
        if state is None or state.pos != pos:
            return None
        self._states.move_to_end(key)
        return state

    def __len__(self) -> int:
        return len(self._states)
