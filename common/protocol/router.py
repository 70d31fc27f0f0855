"""Messages the router receives, on its PULL inbox (workers PUSH to it).

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; its VERSION).

    0x10 Hello        worker -> router: ready handshake (role, inbox address, capacity, token)
    0x11 Heartbeat    worker -> router: alive, with its load and progress; also re-registers after a router restart
    0x12 PrefillDone  prefill -> router: the prompt is prefilled and shipped to decode
    0x13 DecodeStep   decode -> router: one step's new token ids of every sequence (Tokens), with logprobs if asked
    0x14 Finished     decode -> router: the sequence ended; optional final state (its new KV rows only)
    0x15 Failed       any worker -> router: request `rid` failed, or a frame was rejected
    0x16 Snapshot     prefill -> router: the state after the first `pos` prompt tokens (new KV rows only), logits
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

MAX_STEP_SEQUENCES = 1024      # entries of one DecodeStep; decode sends more as several


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


@dataclasses.dataclass(frozen=True)
class Tokens:
    """One sequence's new tokens (an entry of DecodeStep, and what the router queues for its choice).
    When the request asked for logprobs (SamplingParams.logprobs), `logprobs` holds each token's
    log-probability and `top_ids` / `top_logprobs` the top_logprobs most likely tokens' ids and
    log-probabilities after each other, k per token, most likely first (common.logprobs); else all
    three are empty."""

    rid: str
    tokens: list[int]
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_ids: list[int] = dataclasses.field(default_factory=list)
    top_logprobs: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        n, tops = len(self.tokens), len(self.top_ids)
        if not n:
            raise ProtocolError(f"Tokens of {self.rid[:40]!r}: no tokens", self.rid)
        if len(self.logprobs) not in (0, n) or len(self.top_logprobs) != tops or (tops and not self.logprobs):
            raise ProtocolError(f"Tokens of {self.rid[:40]!r}: logprobs, top_ids and top_logprobs must be aligned "
                                "with tokens", self.rid)
        if tops and (tops % n or tops // n > MAX_TOP_LOGPROBS):
            raise ProtocolError(f"Tokens of {self.rid[:40]!r}: {tops} top logprobs for {n} tokens is not at most "
                                f"{MAX_TOP_LOGPROBS} for each", self.rid)


@message(0x13)
class DecodeStep(Message):
    """Every sequence's new tokens of one decode step (vLLM's EngineCoreOutputs): one entry a
    sequence, at most MAX_STEP_SEQUENCES; `rid` is empty, each entry names its own. A sequence
    that ends in the step ends with its Finished after this message."""

    worker_id: str
    seqs: list[Tokens]

    def __post_init__(self):
        if len(self.seqs) > MAX_STEP_SEQUENCES:
            raise ProtocolError(f"DecodeStep: {len(self.seqs)} sequences, at most {MAX_STEP_SEQUENCES} in one step")
        if not all(isinstance(s, Tokens) for s in self.seqs):
            raise ProtocolError("DecodeStep: seqs must be Tokens")
        if len({s.rid for s in self.seqs}) != len(self.seqs):
            raise ProtocolError("DecodeStep: a sequence has two entries in one step")


@message(0x14)
class Finished(Message):
    """End of a sequence. When its request asked for the final state, that state at `pos` as much
    of it as the router lacks: the recurrent arrays (conv..., ssm...), per full layer the K and V
    rows of positions [since, pos) only, and `logits` (vocab,) the distribution the last token was
    sampled from there. `since` is the DecodeRequest's: the router holds the snapshot of the first
    `since` tokens (the prompt's, or 0: none), so the prompt's rows never come back
    (services/router/engine/finals.py). Without the state all four are None."""

    worker_id: str
    reason: str          # "stop" | "length" | "cancelled"
    n_generated: int
    pos: int
    since: int
    recurrent: list | None
    k: list | None
    v: list | None
    logits: object
    kv_type: str         # the type of the state's K and V arrays (common.kv_cache)
    rope_delta: int = 0  # the state's rotary position minus pos (common.state)
    ARRAYS = ("recurrent", "k", "v", "logits")

    def __post_init__(self):
        where = f"Finished of {self.rid[:40]!r}"
        if not 0 <= self.since <= self.pos:
            raise ProtocolError(f"{where}: KV rows from position {self.since} do not end at {self.pos}", self.rid)
        given = [a is not None for a in (self.recurrent, self.k, self.v, self.logits)]
        if any(given) and not all(given):
            raise ProtocolError(f"{where}: recurrent, k, v and logits come together or not at all", self.rid)
        if not all(given):
            return
        if len(self.k) != len(self.v):
            raise ProtocolError(f"{where}: {len(self.k)} K and {len(self.v)} V arrays", self.rid)
        rows = self.pos - self.since
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            if k.ndim < 1 or k.shape[0] != rows or v.shape != k.shape:
                raise ProtocolError(f"{where}: k[{i}] {list(k.shape)} and v[{i}] {list(v.shape)} are not {rows} "
                                    f"rows each, positions [{self.since}, {self.pos})", self.rid)

    def state_bytes(self) -> int:
        """The bytes of the state it carries (its logits not counted)."""
        return sum(a.nbytes for a in [*(self.recurrent or ()), *(self.k or ()), *(self.v or ())])


@message(0x15)
class Failed(Message):
    worker_id: str
    error: str


@message(0x16)
class Snapshot(Message):
    """The state after history[:pos], as much of it as the router lacks: the recurrent arrays
    (conv..., ssm...), per full layer the K and V rows of positions [since, pos) only, and the
    logits of token pos-1. `since` is the pos of the request's previous Snapshot, or its start_pos
    for the first: the router holds every row before it (services/router/engine/snapshot_chains.py), so
    a prompt's KV crosses the wire once however many checkpoints it has."""

    worker_id: str
    pos: int
    since: int
    recurrent: list
    k: list
    v: list
    logits: object
    kv_type: str
    rope_delta: int = 0
    ARRAYS = ("recurrent", "k", "v", "logits")


@message(0x17)
class NotHeld(Message):
    """The prefill worker holds no state under `held` (evicted, or it restarted): the router sends
    the request again with the state's bytes."""

    worker_id: str
    held: str
