"""Messages the router receives, on its PULL inbox (workers PUSH to it).

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; VERSION 8).

    0x10 Hello        worker -> router: ready handshake (role, inbox address, capacity, token)
    0x11 Heartbeat    worker -> router: alive, with its load and progress; also re-registers after a router restart
    0x12 PrefillDone  prefill -> router: the prompt is prefilled and shipped to decode
    0x13 Tokens       decode -> router: newly sampled token ids of one sequence, with their logprobs if asked
    0x14 Finished     decode -> router: the sequence ended; optional final state (snapshot seam)
    0x15 Failed       any worker -> router: request `rid` failed, or a frame was rejected
    0x16 Snapshot     prefill -> router: the state after the first `pos` prompt tokens, and its logits
    0x17 NotHeld      prefill -> router: the state a PrefillRequest named by `held` is no longer held there

Hello and Heartbeat carry the deployment's worker token (`common.worker_token`): the router
admits no worker without it, and never connects to the address of one that lacks it. They also
carry the worker's KV cache type, and Finished and Snapshot their state's: the router refuses a
worker or a state of another type than its own --kv-type. Their `slots` (a decode worker's batch
slots) and `hold_budget` (the bytes of states a prefill worker keeps) are what the router places
requests by (services/router/engine/placement.py); 0 is none, or unknown. A Heartbeat's `steps` and
`busy` tell progress from mere life: a busy worker whose steps stay put has stalled (common.liveness).
"""
from __future__ import annotations

import dataclasses

from common.sampling import MAX_TOP_LOGPROBS

from .codec import Message, ProtocolError, message


@message(0x10)
class Hello(Message):
    worker_id: str
    role: str            # "prefill" | "decode"
    address: str         # the worker's inbox, as the router should connect to it
    capacity: int        # sequences it is willing to hold at once
    model: str
    token: str = ""      # the worker token; "" is refused
    kv_type: str = ""    # the worker's --kv-type; one other than the router's is refused
    slots: int = 0       # sequences one decode step advances (--max-batch); 0: unknown
    hold_budget: int = 0  # bytes of states a prefill worker keeps for later requests; 0: none


@message(0x11)
class Heartbeat(Message):
    worker_id: str
    role: str
    address: str
    capacity: int
    model: str
    running: int
    waiting: int
    token: str = ""
    kv_type: str = ""
    slots: int = 0
    hold_budget: int = 0
    steps: int = 0       # turns of its compute loop so far (common.liveness)
    busy: bool = False   # it holds requests or has messages waiting for its loop


@message(0x12)
class PrefillDone(Message):
    worker_id: str
    n_tokens: int        # tokens actually prefilled (the suffix after any cached prefix)
    seconds: float


@message(0x13)
class Tokens(Message):
    """When the request asked for logprobs (SamplingParams.logprobs), `logprobs` holds each token's
    log-probability and `top_ids` / `top_logprobs` the top_logprobs most likely tokens' ids and
    log-probabilities after each other, k per token, most likely first (common.logprobs); else all
    three are empty."""

    worker_id: str
    tokens: list[int]
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_ids: list[int] = dataclasses.field(default_factory=list)
    top_logprobs: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        n, tops = len(self.tokens), len(self.top_ids)
        if len(self.logprobs) not in (0, n) or len(self.top_logprobs) != tops or (tops and not self.logprobs):
            raise ProtocolError("Tokens: logprobs, top_ids and top_logprobs must be aligned with tokens", self.rid)
        if tops and (tops % n or tops // n > MAX_TOP_LOGPROBS):
            raise ProtocolError(f"Tokens: {tops} top logprobs for {n} tokens is not at most "
                                f"{MAX_TOP_LOGPROBS} for each", self.rid)


@message(0x14)
class Finished(Message):
    """End of a sequence. When asked for, `state` (SequenceState.arrays() order) is the state
    at `pos` and `logits` (vocab,) the distribution the last token was sampled from there."""

    worker_id: str
    reason: str          # "stop" | "length" | "cancelled"
    n_generated: int
    pos: int
    state: list | None
    logits: object
    kv_type: str         # the type of the state's K and V arrays (common.kv_cache)
    rope_delta: int = 0  # the state's rotary position minus pos (common.state)
    ARRAYS = ("state", "logits")


@message(0x15)
class Failed(Message):
    worker_id: str
    error: str


@message(0x16)
class Snapshot(Message):
    """State after history[:pos] (SequenceState.arrays() order) and the logits of token pos-1."""

    worker_id: str
    pos: int
    state: list
    logits: object
    kv_type: str
    rope_delta: int = 0
    ARRAYS = ("state", "logits")


@message(0x17)
class NotHeld(Message):
    """The prefill worker holds no state under `held` (evicted, or it restarted): the router sends
    the request again with the state's bytes."""

    worker_id: str
    held: str
