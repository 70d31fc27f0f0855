"""Sampling: each filter does what its name says, and a seed makes draws repeatable."""
from __future__ import annotations

import numpy as np
import pytest

from common import sampling
from common.sampling import Sampler, SamplingParams

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
DRAWS = 400


def draws(params: SamplingParams, logits=LOGITS, history=()) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(logits, history) for _ in range(DRAWS)])


def test_greedy_takes_the_argmax():
    assert Sampler(SamplingParams()).sample(LOGITS) == 0


def test_seed_repeats_and_differs():
    a = draws(SamplingParams(temperature=1.0, seed=7))
    b = draws(SamplingParams(temperature=1.0, seed=7))
    c = draws(SamplingParams(temperature=1.0, seed=8))
    assert (a == b).all() and (a != c).any()


def test_top_k_keeps_only_k():
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, seed=0))) <= {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.75, seed=0))) == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    assert set(draws(SamplingParams(temperature=1.0, min_p=0.25, seed=0))) == {0, 1, 2}


def test_repetition_penalty_pushes_seen_tokens_down():
    logits = np.array([2.0, 1.9, -1.0])
    assert Sampler(SamplingParams(repetition_penalty=1.5)).sample(logits, history=[0]) == 1


def test_temperature_sharpens():
    cold = draws(SamplingParams(temperature=0.2, seed=0))
    hot = draws(SamplingParams(temperature=2.0, seed=0))
    assert (cold == 0).mean() > (hot == 0).mean()


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1),
                                 dict(min_p=2), dict(repetition_penalty=0)])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


EXTREME = [dict(temperature=1e-320), dict(temperature=1e-320, repetition_penalty=1e-308),
           dict(temperature=2.0, repetition_penalty=1e-308), dict(temperature=1.0, repetition_penalty=1e308),
           dict(temperature=1e-3, top_k=1), dict(temperature=2.0, top_p=1e-300, min_p=1.0),
           dict(temperature=5e-324, top_k=2 ** 62), dict(repetition_penalty=1e-308)]
LOGIT_CASES = [LOGITS, np.array([1e308, -1e308, 1e308, 0.0]), np.array([np.inf, 1.0, np.inf, -np.inf]),
               np.full(4, -np.inf), np.array([np.nan, np.nan, 3.0, np.nan]), np.full(4, np.nan),
               np.array([-1e300, -1e300, -1e300, -1e300]), np.array([5e-324, 0.0, -5e-324, 1e-300])]


@pytest.mark.parametrize("params", EXTREME)
def test_extreme_but_valid_parameters_always_give_a_token(params):
    sampler = Sampler(SamplingParams(seed=0, **params))
    with np.errstate(all="raise"):           # the sampler must keep its own overflows to itself
        for logits in LOGIT_CASES:
            for history in ((), (0, 1, 2, 3)):
                token = sampler.sample(logits, history)
                assert 0 <= token < len(logits)


def test_a_tiny_temperature_is_the_argmax():
    assert Sampler(SamplingParams(temperature=1e-320, seed=1)).sample(LOGITS) == 0
    logits = np.array([2.0, 1.9, -1.0])
    assert Sampler(SamplingParams(temperature=1e-320, repetition_penalty=1e308)).sample(logits, [0]) == 1
    assert Sampler(SamplingParams(temperature=1e-320, repetition_penalty=1e-308)).sample(logits, [1]) == 1


@pytest.mark.parametrize("bad", [dict(temperature=float("nan")), dict(temperature=float("inf")),
                                 dict(top_p=float("nan")), dict(repetition_penalty=float("inf")),
                                 dict(min_p=float("nan"))])
def test_non_finite_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(**bad)


# ---- top-p over a candidate set: the same tokens, the same draws, as a sort of the whole row
def full_sort_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """What the sampler did before: a stable sort of the whole vocabulary."""
    probs = probs.copy()
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order]) / probs.sum()
    probs[order[np.searchsorted(cum, top_p) + 1:]] = 0.0
    return probs


class FullSortSampler(Sampler):
    """The sampler's draw as it was: the whole row sorted, and rng.choice over the vocabulary."""

    def _draw(self, z):
        p = self.params
        if p.top_k > 0 and p.top_k < z.size:
            z[z < np.partition(z, -p.top_k)[-p.top_k]] = -np.inf
        probs = np.exp(z)
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            probs = full_sort_top_p(probs, p.top_p)
        total = probs.sum()
        if not (total > 0 and np.isfinite(total)):
            return int(np.argmax(z))
        return int(self.rng.choice(probs.size, p=probs / total))


def rows(vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    yield rng.normal(size=vocab) * 3                              # peaked, as a model's are
    yield rng.normal(size=vocab) * 0.3                            # nearly flat: the candidates must grow
    yield np.round(rng.normal(size=vocab) * 2)                    # many ties, across the candidates' edge
    flat = np.zeros(vocab)
    flat[rng.integers(0, vocab, 5)] = 4.0
    yield flat                                                    # a plateau of ties below a few tokens
    yield np.where(rng.random(vocab) < 0.9, -np.inf, rng.normal(size=vocab))     # most tokens dead


@pytest.mark.parametrize("top_p", [1e-9, 0.1, 0.5, 0.9, 0.95, 0.999, 1 - 1e-15])
def test_top_p_over_candidates_keeps_exactly_what_the_full_sort_keeps(top_p):
    for seed in range(4):
        for vocab in (3, 70, 5000):
            for logits in rows(vocab, seed):
                if np.isfinite(logits).any():                     # else the sampler draws nothing
                    probs = np.exp(logits - np.max(logits))
                    assert np.array_equal(sampling.top_p_filter(probs, top_p), full_sort_top_p(probs, top_p))


@pytest.mark.parametrize("kw", [dict(top_p=0.9), dict(top_p=0.5, temperature=2.0), dict(top_p=0.99, top_k=300),
                                dict(top_p=0.8, min_p=0.01), dict(top_p=0.95, temperature=0.3), dict()])
def test_the_sampler_draws_the_same_tokens_as_the_full_sort_from_the_same_seed(kw):
    for seed, vocab in ((0, 248_320), (1, 5000), (2, 64)):
        params = SamplingParams(**{"temperature": 1.0, **kw}, seed=seed)
        new, old = Sampler(params), FullSortSampler(params)
        for i, logits in enumerate(rows(vocab, seed)):
            n = 3 if vocab > 100_000 else 40
            assert [new.sample(logits) for _ in range(n)] == [old.sample(logits) for _ in range(n)], (vocab, i)


def test_choose_is_rng_choice():
    rng = np.random.default_rng(5)
    for size in (1, 2, 10, 1000):
        for _ in range(30):
            probs = rng.random(size) * (rng.random(size) < 0.5)
            probs[rng.integers(size)] = 0.5
            a, b = np.random.default_rng(size), np.random.default_rng(size)
            total = probs.sum()
            assert sampling.choose(a, probs, total) == b.choice(size, p=probs / total)
