"""A request body's sampling fields -> SamplingParams: temperature, top_p, top_k, min_p,
repetition_penalty, seed, the presence and frequency penalties, logit_bias and logprobs.

The ranges are OpenAI's, with vLLM's extensions (top_k, min_p, repetition_penalty). Logprobs
differ by endpoint, as in OpenAI's API: chat takes `logprobs: true` and `top_logprobs` in
[0, 20]; completions take `logprobs: k`, the k most likely tokens, which OpenAI bounds at 5 and
vLLM, followed here, at 20. A logit_bias names token ids of this model's vocabulary. A field
out of range is a 400 that names it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from common.sampling import BIAS_RANGE, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, PENALTY_RANGE, SamplingParams

from .errors import bad_request

INT64 = (-2 ** 63, 2 ** 63)
# below 1e-3 a distribution is greedy to within float64 rounding; OpenAI's range ends at 2
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 2.0
# HF, vLLM and llama.cpp users set 1.0-1.5; outside this the logits are all but erased or inverted
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 10.0


def number(body: dict, name: str, kind: type, default: Any, ok: Callable[[Any], bool], rule: str) -> Any:
    """body[name] as `kind` (float or int), `default` when absent or null; a 400 naming it otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise bad_request(f"'{name}' must be {'a number' if kind is float else 'an integer'}", name)
    if isinstance(value, int) and not INT64[0] <= value < INT64[1]:
        raise bad_request(f"'{name}' does not fit a 64-bit integer", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"'{name}' is {value}; it must be a finite number", name)
    if not ok(value):
        raise bad_request(f"'{name}' is {value}; it must be {rule}", name)
    return kind(value)


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """(logprobs, top_logprobs) of chat's `logprobs` + `top_logprobs`, or of completions' `logprobs: k`."""
    bound = f"in [0, {MAX_TOP_LOGPROBS}]"
    if not chat:
        k = number(body, "logprobs", int, None, lambda v: 0 <= v <= MAX_TOP_LOGPROBS, bound)
        return k is not None, k or 0
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad_request("'logprobs' must be a boolean; 'top_logprobs' sets how many alternatives", "logprobs")
    top = number(body, "top_logprobs", int, 0, lambda v: 0 <= v <= MAX_TOP_LOGPROBS, bound)
    if top and not wanted:                # a zero asks for nothing, and clients send it unasked
        raise bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
    return bool(wanted), top


def _logit_bias(body: dict, vocab: int) -> dict[str, float]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad_request("'logit_bias' must be an object of token ids to biases", "logit_bias")
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' may hold at most {MAX_LOGIT_BIAS} tokens, it holds {len(bias)}",
                          "logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= len(str(vocab)) and int(key) < vocab):
            raise bad_request(f"logit_bias: {key[:40]!r} is not a token id of this model, in [0, {vocab})",
                              "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= BIAS_RANGE:
            raise bad_request(f"logit_bias[{key!r}] is {str(value)[:40]}; it must be a number in "
                              f"[{-BIAS_RANGE:g}, {BIAS_RANGE:g}]", "logit_bias")
        out[str(int(key))] = float(value)
    return out


def sampling_params(body: dict, *, chat: bool, vocab: int) -> SamplingParams:
    penalty = (lambda v: -PENALTY_RANGE <= v <= PENALTY_RANGE, f"in [{-PENALTY_RANGE:g}, {PENALTY_RANGE:g}]")
    logprobs, top_logprobs = _logprobs(body, chat)
    return SamplingParams(
        temperature=number(body, "temperature", float, 1.0, lambda v: v == 0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
                           f"0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]"),
        top_p=number(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
        top_k=min(vocab, max(0, number(body, "top_k", int, 0, lambda v: v >= -1, ">= -1 (-1 or 0: off)"))),
        min_p=number(body, "min_p", float, 0.0, lambda v: 0 <= v <= 1, "in [0, 1]"),
        repetition_penalty=number(body, "repetition_penalty", float, 1.0,
                                  lambda v: MIN_REPETITION_PENALTY <= v <= MAX_REPETITION_PENALTY,
                                  f"in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}]"),
        seed=number(body, "seed", int, None, lambda v: 0 <= v < 2 ** 63, "in [0, 2^63)"),
        presence_penalty=number(body, "presence_penalty", float, 0.0, *penalty),
        frequency_penalty=number(body, "frequency_penalty", float, 0.0, *penalty),
        logit_bias=_logit_bias(body, vocab),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
