"""Checks of a worker's request against the model, run before native code or numpy sees it.

The codec guarantees types (int64 integers, finite floats, dicts of scalars, a SamplingParams
that passed its own checks). These add what only the model knows: token ids inside the
vocabulary (logit_bias's too), positions inside the context, the state's KV cache type (the
worker's own) and its shapes and dtypes (common.state.check_state), and a decode address that
can be connected to. Each raises ValueError naming the field.
"""
from __future__ import annotations

import re

import numpy as np

from common.kv_cache import check_same_kv_type
from common.model.config import ModelConfig
from common.sampling import SamplingParams
from common.state import SequenceState, check_logits, check_rope_delta, check_state

from .decode import DecodeRequest
from .prefill import HoldState, PrefillRequest

ENDPOINT = re.compile(r"(tcp://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}|ipc://[^\x00\s]{1,100}"
                      r"|local://[A-Za-z0-9_.\-]{1,100})")


def is_endpoint(address: object) -> bool:
    """A well-formed address to connect to: tcp://host:port (port 1-65535), ipc://path, or
    local://name (common.mp_local: an inbox of this process)."""
    if not isinstance(address, str) or not ENDPOINT.fullmatch(address):
        return False
    return address.startswith(("ipc://", "local://")) or 0 < int(address.rsplit(":", 1)[1]) < 65536


def token_ids(name: str, ids: list[int], vocab: int) -> None:
    if ids:
        a = np.asarray(ids, np.int64)
        if a.min() < 0 or a.max() >= vocab:
            raise ValueError(f"{name}: token ids must be in [0, {vocab})")


def _common(req: DecodeRequest | PrefillRequest, cfg: ModelConfig) -> SamplingParams:
    token_ids("history", req.history, cfg.vocab_size)
    token_ids("stop_ids", req.stop_ids, cfg.vocab_size)
    if req.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
    if not isinstance(req.sampling, SamplingParams):        # the codec builds one; a message made here must too
        raise ValueError(f"sampling: {type(req.sampling).__name__} is not SamplingParams")
    token_ids("sampling.logit_bias", [int(k) for k in req.sampling.logit_bias], cfg.vocab_size)
    return req.sampling


def check_decode(req: DecodeRequest, cfg: ModelConfig, kv_type: str) -> tuple[SequenceState, SamplingParams]:
    """The state to decode from, its KV in `kv_type` (decode's --kv-type), and the sampling
    parameters, or ValueError."""
    params = _common(req, cfg)
    if len(req.history) != req.pos:
        raise ValueError(f"history has {len(req.history)} tokens, the state is at position {req.pos}")
    if req.state is None:
        raise ValueError("state is missing")
    if not 0 <= req.since <= req.pos:
        raise ValueError(f"since {req.since} is outside the state's positions [0, {req.pos}]")
    check_logits(req.logits, cfg)
    check_same_kv_type(req.kv_type, kv_type, "the state sent to decode", "this decode worker")
    if req.hold_at and not is_endpoint(req.hold_at):
        raise ValueError(f"hold_at {req.hold_at!r:.80} is not tcp://host:port or ipc://path")
    return SequenceState.from_arrays(req.pos, list(req.state), cfg, kv_type, req.rope_delta), params


def check_prefill(req: PrefillRequest, cfg: ModelConfig, kv_type: str) -> SequenceState:
    """The (copied, writable) state to prefill on top of, its KV in `kv_type` (prefill's
    --kv-type), or ValueError."""
    _common(req, cfg)
    check_same_kv_type(req.kv_type, kv_type, "the request", "this prefill worker")
    if not req.tokens:
        raise ValueError("nothing to prefill: the request has no tokens")
    token_ids("tokens", req.tokens, cfg.vocab_size)
    end = req.start_pos + len(req.tokens)
    if req.start_pos < 0 or end > cfg.context_length:
        raise ValueError(f"start_pos {req.start_pos} + {len(req.tokens)} tokens is outside the context "
                         f"of {cfg.context_length}")
    if len(req.history) != end or req.history[req.start_pos:] != req.tokens:
        raise ValueError("history must be the prompt, ending with tokens at start_pos")
    if req.snapshot_every < 0:
        raise ValueError("snapshot_every must be >= 0")
    check_rope_delta(req.start_pos, req.rope_delta)
    check_images(req, cfg)
    if not is_endpoint(req.decode_address):
        raise ValueError(f"decode_address {req.decode_address!r:.80} is not tcp://host:port or ipc://path")
    if req.start_state is None:
        if req.start_pos:
            raise ValueError(f"start_pos is {req.start_pos} but no start_state was given")
        return SequenceState.empty(cfg, kv_type)
    check_state(req.start_pos, req.start_state, cfg, kv_type)
    return SequenceState.from_arrays(req.start_pos, [a.copy() for a in req.start_state], cfg, kv_type,
                                     req.rope_delta)


def check_hold(msg: HoldState, cfg: ModelConfig, kv_type: str) -> SequenceState:
    """The state a HoldState brings, after its tokens, its KV in `kv_type`, or ValueError."""
    check_same_kv_type(msg.kv_type, kv_type, "the state from decode", "this prefill worker")
    token_ids("tokens", msg.tokens, cfg.vocab_size)
    if len(msg.tokens) != msg.pos:
        raise ValueError(f"{len(msg.tokens)} tokens for a state at position {msg.pos}")
    return SequenceState.from_arrays(msg.pos, list(msg.state), cfg, kv_type, msg.rope_delta)


def check_images(req: PrefillRequest, cfg: ModelConfig) -> None:
    """The images are uint8 (height, width, 3) pixels, one per run of `image_token` in `tokens`; their
    sizes are held to the vision tower's by the prefill worker, which has it."""
    images = req.images or []
    if not images:
        return
    token_ids("image_token", [req.image_token], cfg.vocab_size)
    if req.start_pos and req.tokens[0] == req.image_token == req.history[req.start_pos - 1]:
        raise ValueError("tokens start inside an image: a prefill resumes before or after an image, not inside one")
    for n, a in enumerate(images):
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3 or min(a.shape[:2]) < 1:
            raise ValueError(f"images[{n}] is {a.dtype}{list(a.shape)}, not uint8 (height, width, 3) pixels")
