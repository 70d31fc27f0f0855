"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seed.

Any finite parameters in range give a token, never NaN or an exception: a NaN logit is never
picked, the logits are clipped before the max is taken off and the temperature divides, so a
tiny temperature or penalty overflows only to -inf, and a distribution with nothing left in it
falls back to the argmax. A grammar's `allowed` mask (common.grammar) keeps the draw, and the
fallback, to the tokens it allows.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import setting

LOGIT_LIMIT = 1e30              # far beyond any real logit, far from float64's overflow
MAX_GRAMMAR_CHARS = 1 << 18     # well inside the header slack of a wire message (common.state)


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence samples; it travels as a typed field of the wire's requests (common.protocol),
    and a value it refuses there is a ProtocolError."""

    temperature: float = setting(0.0, "0 is greedy.", min=0.0)
    top_k: int = setting(0, "Sample from the k most likely tokens; 0 is off.", min=0)
    top_p: float = setting(1.0, "Sample from the fewest tokens whose probabilities reach top_p.")
    min_p: float = setting(0.0, "Drop tokens less likely than min_p times the most likely one.")
    repetition_penalty: float = setting(1.0, "Penalty on the logits of tokens already in the history.")
    seed: int | None = setting(None, "Seed for sampling.")
    # a grammar spec from common.grammar ("" is none); no help text, so it is not a command-line option
    grammar: str = dataclasses.field(default="")

    def __post_init__(self):
        floats = (self.temperature, self.top_p, self.min_p, self.repetition_penalty)
        checks = [(all(isinstance(v, (int, float)) and math.isfinite(v) for v in floats),
                   "sampling parameters must be finite numbers"),
                  (self.temperature >= 0, "temperature must be >= 0"),
                  (isinstance(self.top_k, int) and self.top_k >= 0, "top_k must be an integer >= 0"),
                  (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                  (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
                  (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
                  (self.seed is None or isinstance(self.seed, int) and self.seed >= 0, "seed must be an integer >= 0"),
                  (isinstance(self.grammar, str) and len(self.grammar) <= MAX_GRAMMAR_CHARS,
                   f"grammar must be a string of at most {MAX_GRAMMAR_CHARS} characters")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None) -> int:
        """`allowed`: (vocab,) bool, the tokens a grammar lets through, or None for all. Those are
        sampled among themselves, which costs less than masking the rest of the vocabulary."""
        if allowed is None:
            return self._sample(np.asarray(logits, dtype=np.float64).copy(), history)
        ids = np.flatnonzero(allowed)
        if not ids.size:                     # nothing is allowed: the grammar refuses whatever comes
            return int(np.argmax(logits))
        return int(ids[self._sample(np.asarray(logits, dtype=np.float64)[ids], _within(ids, history))])

    def _sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.params
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            logits[np.isnan(logits)] = -np.inf
            if p.repetition_penalty != 1.0 and len(history):
                seen = np.unique(np.asarray(history, dtype=np.int64))
                vals = logits[seen]
                logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            alive = logits > -np.inf
            if p.temperature == 0.0 or not alive.any():
                return int(np.argmax(logits))
            # z: [vocab], <= 0 with the best at exactly 0; the dead are -inf
            z = np.where(alive, np.clip(logits, -LOGIT_LIMIT, LOGIT_LIMIT), -np.inf)
            z = (z - z.max()) / p.temperature
            return self._draw(z)

    def _draw(self, z: np.ndarray) -> int:
        p = self.params
        if p.top_k > 0 and p.top_k < z.size:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z[z < kth] = -np.inf
        probs = np.exp(z)
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order]) / probs.sum()
            drop = order[np.searchsorted(cum, p.top_p) + 1:]                 # keep the smallest set reaching top_p
            probs[drop] = 0.0
        total = probs.sum()
        if not (total > 0 and math.isfinite(total)):
            return int(np.argmax(z))
        return int(self.rng.choice(probs.size, p=probs / total))


def _within(ids: np.ndarray, history: Sequence[int]) -> np.ndarray:
    """The places in sorted `ids` of the history's tokens that are among them."""
    h = np.asarray(history, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, h), ids.size - 1)
    return at[ids[at] == h]
