"""Presence and frequency penalties, logit_bias and per-copy seeds: what OpenAI's formula says,
checked against a numpy reference, on the whole vocabulary and under a grammar's mask."""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.protocol import ProtocolError, decode_frames, encode_message
from common.protocol.checks import check_decode
from common.protocol.decode import DecodeRequest
from common.sampling import MAX_LOGIT_BIAS, Sampler, SamplingParams
from common.state import state_specs

VOCAB = 1000
PROMPT = [3, 3, 7, 11]
ANSWER = [7, 7, 7, 20, 3, 999]


def row(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=VOCAB).astype(np.float32)


def reference(logits, params: SamplingParams, history, prompt_len) -> np.ndarray:
    """logit_bias, repetition over the whole history, presence and frequency over the answer only."""
    z = np.asarray(logits, np.float64).copy()
    for token, bias in params.logit_bias.items():
        z[int(token)] += bias
    for t in set(history):
        z[t] = z[t] / params.repetition_penalty if z[t] > 0 else z[t] * params.repetition_penalty
    counts = np.bincount(np.asarray(history[prompt_len:], np.int64), minlength=VOCAB)
    return z - (params.presence_penalty * (counts > 0) + params.frequency_penalty * counts)


CASES = [dict(presence_penalty=1.5), dict(frequency_penalty=0.75), dict(presence_penalty=-2.0, frequency_penalty=2.0),
         dict(logit_bias={5: 3.0, "17": -42.5, 999: 100}),
         dict(presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.3, logit_bias={7: 1.0, 3: -1.0})]


@pytest.mark.parametrize("kw", CASES)
def test_the_logits_are_penalized_as_the_formula_says(kw):
    params = SamplingParams(**kw)
    history = PROMPT + ANSWER
    got = Sampler(params, prompt_len=len(PROMPT)).processed(row(1), history)
    np.testing.assert_allclose(got, reference(row(1), params, history, len(PROMPT)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", CASES)
def test_greedy_takes_the_argmax_of_the_penalized_logits_with_and_without_a_grammar(kw):
    params = SamplingParams(**kw)
    history = PROMPT + ANSWER
    for seed in range(20):
        want = reference(row(seed), params, history, len(PROMPT))
        assert Sampler(params, prompt_len=len(PROMPT)).sample(row(seed), history) == int(np.argmax(want))
        allowed = np.random.default_rng(seed).random(VOCAB) < 0.3
        allowed[[3, 7, 20]] = True                   # tokens the penalties and biases touch are among them
        ids = np.flatnonzero(allowed)
        got = Sampler(params, prompt_len=len(PROMPT)).sample(row(seed), history, allowed)
        assert got == int(ids[np.argmax(want[ids])])


def test_presence_and_frequency_count_the_answer_only():
    params = SamplingParams(presence_penalty=2.0, frequency_penalty=1.0)
    logits = row(2)
    got = Sampler(params, prompt_len=len(PROMPT)).processed(logits, PROMPT + [7, 7])
    assert got[3] == logits[3] and got[11] == logits[11]            # the prompt's tokens are not touched
    assert got[7] == pytest.approx(float(logits[7]) - 2.0 - 2 * 1.0)
    same = Sampler(params, prompt_len=len(PROMPT)).processed(logits, PROMPT)
    assert np.array_equal(same, np.asarray(logits, np.float64))      # nothing answered yet, nothing penalized


def test_a_bias_of_minus_100_bans_a_token_and_plus_100_forces_one_at_temperature_0():
    for seed in range(30):
        logits = row(seed)
        best = int(np.argmax(logits))
        assert Sampler(SamplingParams(logit_bias={best: -100})).sample(logits) != best
        forced = (best + 1 + seed) % VOCAB
        assert Sampler(SamplingParams(logit_bias={forced: 100})).sample(logits) == forced
        hot = SamplingParams(temperature=1.0, seed=seed, logit_bias={best: -100})
        assert best not in {Sampler(hot).sample(logits) for _ in range(20)}


def test_penalties_push_a_repeated_token_down_and_a_negative_one_pulls_it_up():
    logits = np.zeros(VOCAB, np.float32)
    logits[[7, 8]] = 5.0, 4.0
    down, up = SamplingParams(frequency_penalty=0.6), SamplingParams(presence_penalty=-2.0)
    assert [Sampler(down).sample(logits, [7] * n) for n in (0, 1, 2)] == [7, 7, 8]
    assert Sampler(up).sample(logits, [8]) == 8


@pytest.mark.parametrize("bad", [dict(presence_penalty=2.01), dict(presence_penalty=-2.5), dict(frequency_penalty=3),
                                 dict(frequency_penalty=float("nan")), dict(presence_penalty=float("inf")),
                                 dict(logit_bias={5: 100.5}), dict(logit_bias={5: -101}), dict(logit_bias={5: True}),
                                 dict(logit_bias={5: float("nan")}), dict(logit_bias={"-1": 1.0}),
                                 dict(logit_bias={"abc": 1.0}), dict(logit_bias={"５": 1.0}), dict(logit_bias={1.5: 1}),
                                 dict(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)}),
                                 dict(logit_bias=[(5, 1.0)])])
def test_out_of_range_values_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_the_bounds_themselves_are_accepted():
    SamplingParams(presence_penalty=-2, frequency_penalty=2, logit_bias={i: (-100, 100)[i % 2] for i in range(1024)})


def test_logit_bias_keys_are_decimal_token_ids_on_the_wire():
    params = SamplingParams(logit_bias={5: 1, "12": -3.5})
    assert params.logit_bias == {"5": 1.0, "12": -3.5} == SamplingParams(logit_bias={"5": 1.0, 12: -3.5}).logit_bias
    msg = DecodeRequest("r", 1, [1], params, 4, [], False, [], np.zeros(3, np.float32), "f32")
    assert decode_frames(encode_message(msg)).sampling == params
    frames = encode_message(dataclasses.replace(msg, sampling=SamplingParams()))
    header = msgpack.unpackb(frames[0])
    header["f"]["sampling"]["logit_bias"] = {"5": 500.0}
    with pytest.raises(ProtocolError, match="logit_bias"):
        decode_frames([msgpack.packb(header), *frames[1:]])


def test_copies_of_a_request_get_distinct_streams_that_repeat():
    params = SamplingParams(temperature=1.0, seed=41)
    logits = row(3)

    def stream(p):
        sampler = Sampler(p)
        return [sampler.sample(logits) for _ in range(30)]

    copies = [stream(params.for_choice(i)) for i in range(3)]
    assert copies == [stream(params.for_choice(i)) for i in range(3)]          # the same request again
    assert len({tuple(c) for c in copies}) == 3
    assert params.for_choice(0) is params and params.for_choice(2).seed == 43
    assert SamplingParams(seed=2 ** 63 - 1).for_choice(1).seed == 0            # wraps inside int64
    assert SamplingParams(temperature=1.0).for_choice(5) == SamplingParams(temperature=1.0)


def test_a_logit_bias_token_outside_the_vocabulary_is_refused_by_decodes_checks():
    cfg = GGUFModel(default_model_path()).config
    state = [np.zeros(shape, dtype) for _, dtype, shape in state_specs(1, cfg, "f32")]

    def request(bias):
        return DecodeRequest("r", 1, [1], SamplingParams(logit_bias=bias), 4, [], False, state,
                             np.zeros(cfg.vocab_size, np.float32), "f32")

    check_decode(request({cfg.vocab_size - 1: 5}), cfg, "f32")
    with pytest.raises(ValueError, match="logit_bias"):
        check_decode(request({cfg.vocab_size: 5}), cfg, "f32")
