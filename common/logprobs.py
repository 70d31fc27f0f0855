"""Log-probabilities of sampled tokens, as OpenAI's `logprobs` and `top_logprobs` report them.

Which distribution: vLLM's default (`logprobs_mode` "raw_logprobs"), the log_softmax of the
logits as the model gave them, before logit_bias, the penalties, temperature, top-k, top-p,
min-p and a grammar's mask. So a token's log-probability says what the model thinks of it,
whatever the request did to the draw; at temperature 0 with nothing else set, the chosen token
is the top one.

Decode computes them for each token it sends (token_logprobs) and sends them in
router.Tokens, the top ones flat (top_ids, top_logprobs); the router turns those into
OpenAI's shapes with split_tops and openai_logprobs. Not here: the sampling itself
(common.sampling).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .sampling import LOGIT_LIMIT

FLOOR = -9999.0       # OpenAI's log-probability of a token the model gives no chance; keeps the wire finite

Tops = Sequence[Sequence[tuple[int, float]]]      # per token: (token id, logprob), most likely first


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> tuple[float, list[int], list[float]]:
    """The log-probability of `token` and the `top_n` most likely tokens' (ids, log-probabilities),
    most likely first and, among equals, the lower id first, in the (vocab,) `logits`. One max and
    one exp-sum over the row; the top ones by a partition, never a sort of the row."""
    x = np.asarray(logits)
    x = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        top = x.max()
        if not np.isfinite(top):                 # a NaN or +inf logit, or none alive: as the sampler sees them
            x = np.minimum(np.where(np.isnan(x), -np.inf, x.astype(np.float64)), LOGIT_LIMIT)
            top = x.max()
        if not np.isfinite(top):
            n = min(top_n, x.size)
            return FLOOR, list(range(n)), [FLOOR] * n
        # the exp of the row in its own precision, summed in float64: a float32 row stays cheap
        lse = float(top) + float(np.log(np.exp(x - top).sum(dtype=np.float64)))
        chosen = max(float(x[token]) - lse, FLOOR)
        n = min(max(top_n, 0), x.size)
        if not n:
            return chosen, [], []
        kth = np.partition(x, x.size - n)[x.size - n]
        above = np.flatnonzero(x > kth)
        ids = np.concatenate([above, np.flatnonzero(x == kth)[:n - above.size]])   # ties at the edge: lower ids
        ids = ids[np.lexsort((ids, -x[ids]))]
        values = np.maximum(x[ids].astype(np.float64) - lse, FLOOR)
    return chosen, ids.tolist(), values.tolist()


def split_tops(n_tokens: int, top_ids: Sequence[int], top_logprobs: Sequence[float]) -> list[list[tuple[int, float]]]:
    """router.Tokens' flat top lists -> per token (id, logprob) pairs."""
    k = len(top_ids) // n_tokens if n_tokens else 0
    return [list(zip(top_ids[i * k:(i + 1) * k], top_logprobs[i * k:(i + 1) * k])) for i in range(n_tokens)]


def openai_logprobs(token_ids: Sequence[int], logprobs: Sequence[float], tops: Tops,
                    token_text: Callable[[int], str], token_bytes: Callable[[int], bytes], chat: bool,
                    text_offset: int = 0) -> dict:
    """OpenAI's `logprobs` of a choice (or of one streamed chunk of it): chat's
    {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, or
    completions' {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}, whose
    offsets count characters from `text_offset` (where this chunk starts in the text)."""
    if len(logprobs) != len(token_ids) or len(tops) != len(token_ids):
        raise ValueError("token_ids, logprobs and tops must be aligned")
    if chat:
        def entry(t: int, lp: float) -> dict:
            return {"token": token_text(t), "logprob": lp, "bytes": list(token_bytes(t))}
        return {"content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
                            for t, lp, top in zip(token_ids, logprobs, tops)]}
    texts = [token_text(t) for t in token_ids]
    offsets, at = [], text_offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    top_maps = []
    for top in tops:
        top_maps.append({})
        for i, v in top:
            top_maps[-1].setdefault(token_text(i), v)       # two tokens of one text: the likelier stands
    return {"tokens": texts, "token_logprobs": list(logprobs), "top_logprobs": top_maps, "text_offset": offsets}

