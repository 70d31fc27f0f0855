"""Drafts and their acceptance: which token a verified row gives, and whether it is the draft.

A draft is drawn from the MTP block's row, q, shaped by the sequence's own sampler (logit_bias,
penalties over the history and the drafts before it, temperature, top-k, min-p, top-p); the
verified row gives p the same way (Sampler.distribution). Then, as in Leviathan et al. and
Chen et al. (speculative sampling):
- greedy (temperature 0): the row's token is the one sampling gives, the argmax; the draft is
  accepted when it is that token, so the output is the non-speculative output, exactly;
- temperature > 0: the draft d is accepted with probability min(1, p(d) / q(d)); on a rejection
  the token is drawn from normalize(max(p - q, 0)). Every token then has probability p, so the
  output distribution is that of sampling without speculation.
The draws use the sequence's own generator, so that a seed repeats a speculative run.

`ForcedAcceptance` is the benchmark's: it accepts each draft with a fixed probability whatever
the rows say (random weights accept nothing), so that the draft and verify costs are real.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import Sampler, choose


def _plain(sampler: Sampler) -> bool:
    """No logit_bias and no penalties: the processed row is the row itself (NaN aside)."""
    p = sampler.params
    return not p.logit_bias and p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty


def sample(sampler: Sampler, row: np.ndarray, history: Sequence[int], allowed: np.ndarray | None = None) -> int:
    """sampler.sample(row, history, allowed), the same token; greedy without bias or penalties is
    the argmax of the row as it came, without the float64 copy sample() makes (a cycle takes
    several tokens, over vocabularies of 248k)."""
    if allowed is None and sampler.params.temperature == 0.0 and _plain(sampler):
        at = int(np.argmax(row))
        if not np.isnan(row[at]):           # argmax meets a NaN first when there is one
            return at
    return sampler.sample(row, history, allowed)


def full_row(logits: np.ndarray, ids: np.ndarray | None, vocab: int) -> np.ndarray:
    """A draft row over the token ids `ids` (None: already the whole vocabulary) as a (vocab,) row,
    -inf where the draft head does not reach."""
    if ids is None:
        return logits
    out = np.full(vocab, -np.inf, np.float32)
    out[ids] = logits
    return out


def propose(sampler: Sampler, logits: np.ndarray, history: Sequence[int], ids: np.ndarray | None,
            vocab: int) -> tuple[int, np.ndarray | None]:
    """A draft from the MTP block's row `logits` (over `ids`), and the distribution q it was drawn
    from; q is None when greedy, whose acceptance needs none."""
    if sampler.params.temperature == 0.0:
        if _plain(sampler):
            at = int(np.argmax(logits))
            if not np.isnan(logits[at]):           # argmax meets a NaN first when there is one
                return (int(ids[at]) if ids is not None else at), None
        return int(np.argmax(sampler.processed(full_row(logits, ids, vocab), history))), None
    q = sampler.distribution(full_row(logits, ids, vocab), history)
    return choose(sampler.rng, q, 1.0), q


def judge(sampler: Sampler, row: np.ndarray, history: Sequence[int], draft: int,
          q: np.ndarray | None) -> tuple[int, bool]:
    """The token that verified row `row` gives after `history`, and whether it is `draft` (drawn
    from q; None: greedy)."""
    if q is None:
        token = sample(sampler, row, history)
        return token, token == draft
    p = sampler.distribution(row, history)
    if sampler.rng.random() * q[draft] < p[draft]:       # probability min(1, p(d) / q(d))
        return draft, True
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if not total > 0:        # p and q equal to rounding: a rejection has no mass of its own left
        residual, total = p, 1.0
    return choose(sampler.rng, residual, total), False


class ForcedAcceptance:
    """A judge for benchmarks: each draft is taken with probability `rate` (its own seeded
    generator), up to the first refusal, whose token is the one sampling gives."""

    def __init__(self, rate: float, seed: int = 0):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the acceptance rate must be in [0, 1], got {rate}")
        self.rate = rate
        self.rng = np.random.default_rng(seed)

    def __call__(self, sampler: Sampler, row: np.ndarray, history: Sequence[int], draft: int,
                 q: np.ndarray | None) -> tuple[int, bool]:
        if self.rng.random() < self.rate:
            return draft, True
        return sample(sampler, row, history), False
