"""Messages a prefill worker receives, on its PULL inbox (besides worker.HelloAck and Cancel).

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; VERSION 5).

    0x20 PrefillRequest  router -> prefill: tokens to run, where to ship the result

`start_state` (SequenceState.arrays() order, at position `start_pos`) is the snapshot seam:
when set, only `tokens` (the suffix after the cached prefix) are prefilled on top of it. A
prompt that is cached whole skips prefill: the router sends decode.DecodeRequest itself.
`snapshot_every` > 0 asks for Snapshot messages (router.py) at absolute positions that are
multiples of it, and at the end of the prompt.
`history` is the whole prompt, which the sampler may need (repetition penalty).
"""
from __future__ import annotations

from common.sampling import SamplingParams

from .codec import Message, message


@message(0x20)
class PrefillRequest(Message):
    tokens: list[int]            # the part of the prompt to prefill
    history: list[int]           # the whole prompt
    start_pos: int
    decode_address: str          # inbox of the decode worker the router chose
    sampling: SamplingParams
    max_tokens: int
    stop_ids: list[int]
    return_state: bool
    start_state: list | None
    snapshot_every: int          # send the router a Snapshot every this many tokens and at the end; 0: never
    kv_type: str                 # the type of start_state's K and V arrays, and of the state to ship
    ARRAYS = ("start_state",)
