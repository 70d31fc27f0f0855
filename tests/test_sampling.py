"""Sampling: each filter does what its name says, and a seed makes draws repeatable."""
from __future__ import annotations

import numpy as np
import pytest

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
