"""Messages a prefill worker receives, on its PULL inbox (besides worker.HelloAck and Cancel).

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; its VERSION).

    0x20 PrefillRequest  router -> prefill: tokens to run, where to ship the result
    0x21 HoldState       decode -> prefill: a finished sequence's state, for the worker to keep

`start_state` (SequenceState.arrays() order, at position `start_pos`) is the snapshot seam:
when set, only `tokens` (the suffix after the cached prefix) are prefilled on top of it. A
prompt that is cached whole skips prefill: the router sends decode.DecodeRequest itself.
`snapshot_every` > 0 asks for Snapshot messages (router.py) at absolute positions that are
multiples of it, and at the end of the prompt.
`history` is the whole prompt, which the sampler may need (repetition penalty).
`rope_delta` is start_state's (common.state). `images` are the pixels of the images whose image
tokens lie in `tokens`, in order: uint8 (height, width, 3), already resized to whole image tokens
(common/vision/preprocess.py smart_resize), which prefill's vision encoder turns into the rows that
those image tokens take, one run of `image_token`s per image.
`held` names, instead of start_state, a state the worker keeps (the hex snapshot key of
history[:start_pos], common/snapshots/keys.py): one it does not hold is answered with
router.NotHeld. `hold` asks it to keep this request's states, and decode to send it the final one
(HoldState, the state after tokens[:pos]).
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
    rope_delta: int = 0          # start_state's rotary position minus start_pos
    images: list | None = None   # uint8 (height, width, 3) per image in `tokens`; None: none
    image_token: int = -1        # the id of the image tokens (<|image_pad|>) that the images' rows replace
    held: str = ""               # the key of a state this worker holds, in place of start_state; "": none
    hold: bool = False           # keep this request's states here, and have decode send back the final one
    ARRAYS = ("start_state", "images")


@message(0x21)
class HoldState(Message):
    """The state after tokens[:pos] (SequenceState.arrays() order), its KV in `kv_type`."""

    worker_id: str
    pos: int
    tokens: list[int]
    state: list
    kv_type: str
    rope_delta: int = 0
    ARRAYS = ("state",)
