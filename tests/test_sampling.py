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
