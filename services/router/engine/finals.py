"""The router's side of a sequence's end: its final state, when decode sends one (Finished),
kept as a snapshot. Decode sends the recurrent state whole and of the KV only the rows past
`since`, the position its DecodeRequest named (services/decode/outputs.py): the router holds the
snapshot of the first `since` tokens, prefill's last Snapshot of the prompt or the state the
request started from. The final state's KV is that snapshot's blocks, the store's own arrays
(common/snapshots/parts.py), followed by the new rows, so the prompt's KV crosses the wire once.
With `since` 0 the state comes whole. When the store no longer holds that snapshot (evicted
since, or refused), or the rows do not follow it, the final state is dropped and counted
(fermium_final_states_dropped_total{reason}); the request itself has ended well either way.
"""
from __future__ import annotations

from common.protocol.router import Finished

from .track import Track


class FinalStates:
    """Mixed into the Dispatcher (dispatch.py), whose cache, chains, placement, metrics and
    `_refusals` (a common.log_limit.LogLimiter) it uses."""

    def _final(self, track: Track, msg: Finished) -> None:
        if msg.recurrent is None:              # not asked for, or the sequence was cancelled
            return
        ids = track.prompt + tuple(track.generated)
        key = self._keep_final(track, ids, msg)
        if track.hold and track.prefill:       # decode sent it to the prefill worker too
            self.placement.held_by(track.prefill, ids, msg.pos, key)

    def _keep_final(self, track: Track, ids: tuple[int, ...], msg: Finished) -> bytes | None:
        if not msg.since:                      # whole; a cache without images keeps its signature
            extra = {"marks": track.marks, "rope_delta": msg.rope_delta} if track.marks else {}
            return self.cache.store_state(ids, msg.pos, [*msg.recurrent, *msg.k, *msg.v], msg.logits, "decode",
                                          msg.kv_type, **extra)
        parts = self.cache.held_parts(ids[:msg.since], track.marks)
        if parts is None:
            self.metrics.final_states_dropped.labels("unheld").inc()
            return None
        rows = msg.pos - msg.since
        try:
            parts.check_rows(msg.k, msg.v, rows)
        except ValueError as e:
            self.metrics.final_states_dropped.labels("invalid").inc()
            self.metrics.protocol_error("invalid")
            self._refusals("router refused a final state at %d (rid %.40s, from %.40s): %s", msg.pos, msg.rid,
                           msg.worker_id, e)
            return None
        return self.cache.store_parts(ids, parts.extend(msg.k, msg.v, rows, self.chains.block), msg.recurrent,
                                      msg.logits, "decode", msg.kv_type, track.marks, msg.rope_delta)
