"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0 means greedy
    top_k: int = 0                  # 0 means off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        checks = [(self.temperature >= 0, "temperature must be >= 0"),
                  (self.top_k >= 0, "top_k must be >= 0"),
                  (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                  (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
                  (self.repetition_penalty > 0, "repetition_penalty must be > 0")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float64).copy()
        if p.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            vals = logits[seen]
            logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.temperature == 0.0:
            return int(np.argmax(logits))
        logits /= p.temperature
        if p.top_k > 0 and p.top_k < logits.size:
            kth = np.partition(logits, -p.top_k)[-p.top_k]
            logits[logits < kth] = -np.inf
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            drop = order[np.searchsorted(cum, p.top_p) + 1:]                 # keep the smallest set reaching top_p
            probs[drop] = 0.0
        probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))
