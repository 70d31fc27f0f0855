"""What a prefill worker puts in a Snapshot: the recurrent state and the logits whole, and of the
KV only the rows the router does not hold yet, those past the request's previous Snapshot (past
its start_pos for the first: the router holds the state the request started from). So the KV
of a prompt crosses the wire once, where every checkpoint used to carry it all from position 0.
The router assembles each snapshot's KV from the rows it has (services/router/engine/snapshot_chains.py).
Decode, told the same position (DecodeRequest.since), sends back only the rows past it at the end.
"""
from __future__ import annotations

import numpy as np

from common.protocol.prefill import PrefillRequest
from common.protocol.router import Snapshot
from common.state import SequenceState


class SnapshotRows:
    """The position up to which the router holds the KV of the request being prefilled (one at a time)."""

    def __init__(self):
        self.rid, self.pos = "", 0

    def start(self, req: PrefillRequest) -> None:
        self.rid, self.pos = req.rid, req.start_pos

    def held(self, req: PrefillRequest) -> int:
        """The position up to which the router holds req's KV: its last Snapshot's, else its start_pos."""
        return self.pos if self.rid == req.rid else req.start_pos

    def message(self, req: PrefillRequest, worker_id: str, pos: int, state: SequenceState,
                logits: np.ndarray) -> Snapshot:
        """The Snapshot of `state` at `pos` (its K and V hold at least `pos` rows), with the rows the
        router lacks; from here on the router holds them. Every array is a copy: the frames leave on
        the IO thread while the backend may reuse its arrays."""
        since = self.held(req)
        n_lin = len(state.conv)
        msg = Snapshot(req.rid, worker_id, pos, since, [a.copy() for a in state.arrays()[:2 * n_lin]],
                       [k[since:pos].copy() for k in state.k], [v[since:pos].copy() for v in state.v],
                       logits.astype("float32", copy=True), state.kv_type, state.rope_delta)
        self.rid, self.pos = req.rid, pos
        return msg


def snapshot_bytes(msg: Snapshot) -> int:
    return sum(a.nbytes for a in [*msg.recurrent, *msg.k, *msg.v, msg.logits])
