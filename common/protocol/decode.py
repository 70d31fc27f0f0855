"""Messages a decode worker receives, on its PULL inbox (besides worker.HelloAck and Cancel).

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; its VERSION).

    0x30 DecodeRequest  prefill -> decode: the prefilled state and the first token's logits

`state` is SequenceState.arrays() at position `pos` (conv..., ssm..., k..., v...), one frame
per array, its K and V in `kv_type`; `logits` is (vocab,) float32. Decode samples the first
token from `logits`. `rope_delta` is the state's (common.state): decode rotates its rows at
pos + rope_delta, where a prompt with images left it. `hold_at`, when set, is the inbox of the
prefill worker that keeps this sequence's final state: decode sends it there too, as
prefill.HoldState, when the sequence ends with return_state. `since` says which of the final
state's KV rows go back to the router in Finished: those of positions [since, end) only, for the
router holds the snapshot of history[:since] (prefill's last Snapshot, or the state it sent); 0 when
it holds none (no Snapshots were asked for, and the prompt started from nothing).
"""
from __future__ import annotations

from common.sampling import SamplingParams

from .codec import Message, message


@message(0x30)
class DecodeRequest(Message):
    pos: int
    history: list[int]           # the whole prompt
    sampling: SamplingParams
    max_tokens: int
    stop_ids: list[int]
    return_state: bool
    state: list
    logits: object
    kv_type: str                 # the type of the state's K and V arrays (common.kv_cache)
    rope_delta: int = 0          # the state's rotary position minus pos (images in the prompt)
    hold_at: str = ""            # a prefill worker's inbox that keeps the final state; "": none
    since: int = 0               # the router holds the final state's KV rows before it; 0: none
    ARRAYS = ("state", "logits")
