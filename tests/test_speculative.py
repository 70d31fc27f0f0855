"""Speculative decoding's cycle (common/speculative.py) is lossless: greedy output, final states and
final logits are those of decoding one token a step, for a batch of sequences and wherever a
sequence ends; at temperature 0.8 the tokens' distribution is that of plain sampling (chi-square
against the exact distribution); drafting turns itself off when it does not pay; a grammar's
sequence never drafts. On a toy runner (tests/speculative_helpers.py) and on the reference model
of a synthetic file with an MTP block."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from common.generation import GenerationPolicy
from common.sampling import Sampler, SamplingParams, choose
from common.speculative import (
    DRAFT_COST,
    PROBE_AFTER,
    PROBE_RATE,
    RATE_WEIGHT,
    Drafting,
    Lane,
    SpeculationError,
    Speculator,
    check_mtp,
    draft_vocab_ids,
)
from common.speculative_accept import ForcedAcceptance, judge
from tests.speculative_helpers import OracleDrafts, ToyRunner, plain_run, same_state, spec_lanes

PROMPTS = [[1, 2, 3], [7], [5, 9, 11, 13, 2, 4], [30, 31]]
CHI2_Z = 3.090          # the standard normal's 0.999 quantile: a true distribution fails 1 run in 1,000
MIN_EXPECTED = 5        # cells expected to hold fewer samples are pooled, as the chi-square test needs


def chi2_critical(df: int, z: float = CHI2_Z) -> float:
    """Wilson-Hilferty's approximation of the chi-square quantile (within 1% for df >= 3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic of observed `counts` against exact `probs` (cells of small expectation
    pooled), and its degrees of freedom."""
    big = {c for c, p in probs.items() if p * n >= MIN_EXPECTED}
    obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    exp = [probs[c] * n for c in big] + [n * (1 - sum(probs[c] for c in big))]
    if exp[-1] < MIN_EXPECTED:           # the pool is too small to be a cell: fold it into the smallest one
        i = int(np.argmin(exp[:-1]))
        obs[i], exp[i] = obs[i] + obs[-1], exp[i] + exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp)), len(obs) - 1


# ---- greedy: identical to plain decoding

@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_batch_is_plain_decoding_token_for_token_and_state_for_state(k):
    runner = ToyRunner()
    spec = Speculator(runner, k)
    greedy = [SamplingParams()] * len(PROMPTS)
    max_tokens = [40, 23, 31, 17]
    results, lanes, cycles = spec_lanes(runner, spec, PROMPTS, greedy, max_tokens)
    for prompt, n, (tokens, state, logits) in zip(PROMPTS, max_tokens, results):
        want, want_state, want_logits = plain_run(runner, prompt, SamplingParams(), n)
        assert tokens == want and len(tokens) == n
        same_state(state, want_state)
        np.testing.assert_array_equal(logits, want_logits)
    assert 0.2 < spec.acceptance < 0.95           # drafts are both taken and refused along the way
    assert len(cycles) < max(max_tokens)          # accepted drafts made fewer cycles than tokens
    assert runner.calls["verify"] == len(cycles)  # the batch shares one verify a cycle


def _accepted_run(runner, k: int, n: int = 60) -> tuple[list[int], int]:
    """The tokens of a greedy run, and how many came before a cycle that accepted every draft."""
    spec = Speculator(runner, k)
    results, _, cycles = spec_lanes(runner, spec, [PROMPTS[0]], [SamplingParams()], [n])
    before = 1                            # the first token comes from the prompt's logits
    for (s,) in cycles:
        if s.accepted == k >= 2:
            return results[0][0], before
        before += s.kept
    pytest.fail("no cycle accepted all its drafts")


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("end", ["max_tokens", "stop string", "stop id"])
def test_an_end_inside_an_accepted_run_keeps_only_what_was_taken(k, end):
    runner = ToyRunner()
    tokens, before = _accepted_run(runner, k)
    inside = before + 1                    # the cycle's first accepted draft ends the sequence; more were accepted
    text = {t: chr(ord("a") + t) for t in range(runner.V)}.get
    kwargs = {"max_tokens": dict(max_tokens=inside),
              "stop string": dict(max_tokens=60, stop=["".join(text(t) for t in tokens[inside - 2:inside])],
                                  text=text),
              "stop id": dict(max_tokens=60, stop_ids=[tokens[inside - 1]])}[end]
    n = kwargs.pop("max_tokens")
    want, want_state, want_logits = plain_run(runner, PROMPTS[0], SamplingParams(), n, **kwargs)
    results, lanes, _ = spec_lanes(runner, Speculator(runner, k), [PROMPTS[0]], [SamplingParams()], [n], **kwargs)
    got, state, logits = results[0]
    assert got == want
    assert len(got) <= inside
    same_state(state, want_state)
    np.testing.assert_array_equal(logits, want_logits)
    assert lanes[0].policy.finish_reason == ("length" if end == "max_tokens" else "stop")


def test_the_draft_block_runs_each_decoded_position_once_with_the_token_taken_after_it():
    runner = ToyRunner()
    prompt = PROMPTS[2]
    results, lanes, cycles = spec_lanes(runner, Speculator(runner, 3), [prompt], [SamplingParams()], [50])
    tokens, state, _ = results[0]
    d = lanes[0].draft
    # positions decoded: every token taken but the last, which is never fed; the MTP block ran
    # all of them but the last cycle's, which ended the sequence
    assert state.pos - len(prompt) == len(tokens) - 1
    assert d.state.pos + len(d.pending) + cycles[-1][0].kept == len(tokens) - 1
    # MTP row i: (the trunk's hidden after token i, token i + 1)
    trunk, hidden = runner.new_state(), []
    runner.prefill(prompt, trunk)
    for t in tokens[:-1]:
        hidden.append(runner.verify([[t]], [trunk], [None])[1][0])
    np.testing.assert_array_equal(d.state.k[:d.state.pos, 0], tokens[1:d.state.pos + 1])
    np.testing.assert_allclose(d.state.k[:d.state.pos, 1:], np.stack(hidden[:d.state.pos]), atol=1e-12)


def test_a_reduced_draft_vocabulary_drafts_only_its_tokens_and_stays_lossless():
    runner = ToyRunner()
    ids = np.array([*range(20), 39], np.int64)
    spec = Speculator(runner, 2, draft_ids=ids)
    drafted = []
    step = spec.step

    def watch(seqs, emit, masks=None):
        drafted.extend(t for s in seqs if s.draft is not None for t in s.draft.drafts)
        return step(seqs, emit, masks)

    spec.step = watch
    results, _, _ = spec_lanes(runner, spec, PROMPTS, [SamplingParams()] * 4, [30] * 4)
    assert drafted and set(drafted) <= set(ids.tolist())
    for prompt, (tokens, _, _) in zip(PROMPTS, results):
        assert tokens == plain_run(runner, prompt, SamplingParams(), 30)[0]


def test_draft_vocab_ids_keep_the_lowest_ids_and_every_special_token(tmp_path):
    from common.model.gguf_file import GGUFModel
    from tests.stack_helpers import SPECIALS, write_tiny_gguf
    model = GGUFModel(write_tiny_gguf(tmp_path / "tiny.gguf"))
    ids = draft_vocab_ids(model, 100)
    tokens = list(model.get("tokenizer.ggml.tokens"))
    assert ids.tolist() == [*range(100), *(tokens.index(s) for s in SPECIALS)]
    assert draft_vocab_ids(model, 0) is None and draft_vocab_ids(model, model.config.vocab_size) is None
    with pytest.raises(SpeculationError, match="MTP block"):
        check_mtp(model)


# ---- temperature > 0: the distribution of plain sampling

def test_rejection_sampling_gives_the_target_distribution_whatever_the_draft():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=12) * 2
    params = SamplingParams(temperature=0.8, seed=5)
    sampler = Sampler(params)
    p = sampler.distribution(logits)
    q = np.random.default_rng(2).dirichlet(np.ones(12))
    n, counts = 20000, {}
    for _ in range(n):
        draft = choose(sampler.rng, q, 1.0)
        token, took = judge(sampler, logits, [], draft, q)
        assert took == (token == draft) or not took
        counts[token] = counts.get(token, 0) + 1
    stat, df = chi2_statistic(counts, dict(enumerate(p)), n)
    assert stat < chi2_critical(df), (stat, df)


def test_distribution_is_what_sample_draws_from():
    logits = np.random.default_rng(3).normal(size=64).astype(np.float32) * 3
    for params in (SamplingParams(temperature=0.8, top_k=10, seed=1),
                   SamplingParams(temperature=1.2, top_p=0.7, seed=2),
                   SamplingParams(temperature=0.5, min_p=0.1, seed=3, logit_bias={4: 5.0}),
                   SamplingParams(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.5, seed=4)):
        history = [4, 4, 9, 17]
        a, b = Sampler(params, prompt_len=1), Sampler(params, prompt_len=1)
        dist = b.distribution(logits, history)
        assert dist.sum() == pytest.approx(1.0)
        # the same stream draws the same tokens from either
        assert [a.sample(logits, history) for _ in range(300)] == [choose(b.rng, dist, 1.0) for _ in range(300)]
    greedy = Sampler(SamplingParams()).distribution(logits)
    assert greedy[int(np.argmax(logits))] == 1.0 and greedy.sum() == 1.0


def _exact_pairs(runner, prompt, params, first: int) -> dict:
    """The exact probability of each (token `first`, token `first` + 1) of plain sampling, every
    path to them enumerated (paths below 1e-9 left out)."""
    out = {}

    def walk(state, history, logits, depth, prob, sampler):
        dist = sampler.distribution(logits, history)
        for t in np.flatnonzero(dist * prob > 1e-9):
            s = state.copy()
            row = runner.decode([int(t)], [s])[0]
            if depth == first + 1:
                key = tuple(history[len(prompt) + first:]) + (int(t),)
                out[key] = out.get(key, 0.0) + prob * dist[t]
            else:
                walk(s, history + [int(t)], row, depth + 1, prob * dist[t], sampler)

    state = runner.new_state()
    logits = runner.prefill(prompt, state)
    walk(state, list(prompt), logits, 0, 1.0, Sampler(params, prompt_len=len(prompt)))
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_tokens_decided_by_drafts_have_plain_samplings_distribution(k):
    """Tokens 3 and 4: the first that a verify decides against drafts (token 1 comes from the
    prompt, token 2 from the first cycle, which has no draft yet); penalties count the drafts."""
    runner = ToyRunner(vocab=12, noise=1.0)
    prompt = [1, 2, 3]
    params = SamplingParams(temperature=0.8, repetition_penalty=1.2, frequency_penalty=0.4)
    exact = _exact_pairs(runner, prompt, params, first=2)
    n, counts = 2000, {}
    for seed in range(n):
        spec = Speculator(runner, k)
        seeded = dataclasses.replace(params, seed=seed)
        results, _, _ = spec_lanes(runner, spec, [prompt], [seeded], [4])
        key = tuple(results[0][0][2:4])
        counts[key] = counts.get(key, 0) + 1
    stat, df = chi2_statistic(counts, exact, n)
    assert df >= 3
    assert stat < chi2_critical(df), (stat, df)


# ---- when drafting stops paying

def test_drafting_stops_when_acceptance_is_below_its_cost_and_probes_again():
    k = 2
    d = Drafting(None, None, k)
    cycles = 0
    while d.active:
        d.record(k, 0, 1)
        cycles += 1
    # the average falls from k by (1 - RATE_WEIGHT) a cycle until it is below DRAFT_COST * k
    assert cycles == math.ceil(math.log(DRAFT_COST) / math.log(1 - RATE_WEIGHT))
    assert d.idle == PROBE_AFTER
    for _ in range(PROBE_AFTER - 1):
        d.record(0, 0, 1)
        assert not d.active
    d.record(0, 0, 1)
    assert d.active and d.rate == PROBE_RATE * k
    d.record(k, k, k + 1)                         # a probe that pays keeps drafting
    assert d.active and d.rate > PROBE_RATE * k
    keep = Drafting(None, None, k)
    for _ in range(50):
        keep.record(k, 1, 2)                      # one draft in two: pays, drafting stays on
    assert keep.active


def test_a_draft_that_never_agrees_turns_itself_off_and_output_stays_plain():
    runner = ToyRunner(noise=40.0)
    spec = Speculator(runner, 3)
    n = 120
    results, lanes, cycles = spec_lanes(runner, spec, [PROMPTS[0]], [SamplingParams()], [n])
    assert results[0][0] == plain_run(runner, PROMPTS[0], SamplingParams(), n)[0]
    drafting = sum(1 for (s,) in cycles if s.drafted)
    assert 0 < drafting < len(cycles) / 3         # off most of the time, probing now and then
    probes = sum(1 for a, b in zip(cycles, cycles[1:]) if not a[0].drafted and b[0].drafted)
    assert probes >= 2
    d = lanes[0].draft
    # the rows owed while off were run when it probed, or are still owed
    assert d.state.pos + len(d.pending) + cycles[-1][0].kept == len(results[0][0]) - 1


def test_forced_acceptance_takes_drafts_at_its_rate():
    runner = ToyRunner(noise=40.0)
    spec = Speculator(runner, 3, judge=ForcedAcceptance(0.7, seed=0))
    results, _, cycles = spec_lanes(runner, spec, [PROMPTS[0]], [SamplingParams()], [400])
    assert len(results[0][0]) == 400
    assert all(s.drafted == 3 or s.finished or not s.drafted for (s,) in cycles)
    # at most 3 of a cycle, each at 0.7 up to the first refusal: about 0.7 + 0.49 + 0.343 a cycle
    per_cycle = spec.accepted / sum(1 for (s,) in cycles if s.drafted)
    assert 1.2 < per_cycle < 1.9


# ---- grammars

def test_a_grammar_sequence_never_drafts_and_shares_the_verify():
    runner = ToyRunner()
    allowed = np.zeros(runner.V, bool)
    allowed[::3] = True
    rows = []
    verify = runner.verify

    def watch(tokens, states, rollbacks):
        rows.append([len(t) for t in tokens])
        return verify(tokens, states, rollbacks)

    runner.verify = watch
    spec = Speculator(runner, 2)
    results, lanes, _ = spec_lanes(runner, spec, PROMPTS[:2], [SamplingParams()] * 2, [30, 30], grammar=(1,),
                                   allowed=allowed)
    assert lanes[1].draft is None
    assert all(r[1] == 1 for r in rows if len(r) == 2) and any(r[0] > 1 for r in rows)
    assert all(allowed[t] for t in results[1][0])
    assert results[1][0] == plain_run(runner, PROMPTS[1], SamplingParams(), 30, allowed=allowed)[0]
    assert results[0][0] == plain_run(runner, PROMPTS[0], SamplingParams(), 30)[0]


def test_a_failing_sampler_fails_its_sequence_alone():
    runner = ToyRunner()
    spec = Speculator(runner, 2)
    lanes = []
    for prompt in PROMPTS[:2]:
        lane = Lane(runner.new_state(), Sampler(SamplingParams(temperature=0.5)), list(prompt), GenerationPolicy(20))
        runner.prefill(prompt, lane.state)
        lane.next_token, lane.draft = prompt[-1], spec.start()
        lanes.append(lane)

    def broken(*_):
        raise RuntimeError("boom")

    lanes[0].sampler.sample = broken

    def emit(lane, token, row):
        lane.history.append(token)
        lane.next_token = token
        return True

    a, b = spec.step(lanes, emit)
    assert isinstance(a.error, RuntimeError) and a.finished
    assert b.error is None and not b.finished and lanes[1].state.pos == len(PROMPTS[1]) + 1


# ---- the reference model of a synthetic file with an MTP block

@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    import sys
    from pathlib import Path

    from common.model.gguf_file import GGUFModel
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from make_synthetic_gguf import TINY, write_synthetic
    path = write_synthetic(tmp_path_factory.mktemp("spec") / "mtp.gguf", layers=4, recipe="q8_0", widths=TINY, mtp=True)
    return GGUFModel(path)


@pytest.fixture(scope="module")
def reference(mtp_model):
    from common.reference.model import ReferenceModel
    return ReferenceModel(mtp_model)


@pytest.fixture(scope="module")
def native(mtp_model):
    from native.cpu_runner import CpuRunner
    return CpuRunner(mtp_model, threads=1, kv_type="f32")


REF_PROMPTS = [[3, 17, 250, 9], [77], [401, 5, 12, 8, 100, 6]]
# verify runs the rows as decode does, one by one; only a sum's order may differ
REF_TOL = 1e-5


def oracle_lanes(runner, k: int, max_tokens: list[int], n_oracle: int = 40):
    """Plain greedy runs, then the speculative batch with drafts that often guess them."""
    plain = [plain_run(runner, p, SamplingParams(), n) for p, n in zip(REF_PROMPTS, max_tokens)]
    oracle = OracleDrafts(runner, [plain_run(runner, p, SamplingParams(), n_oracle)[0] for p in REF_PROMPTS])
    spec = Speculator(oracle, k)
    results, _, cycles = spec_lanes(oracle, spec, REF_PROMPTS, [SamplingParams()] * len(REF_PROMPTS), max_tokens)
    return plain, results, cycles, spec


@pytest.mark.parametrize("k", [1, 2, 3])
def test_reference_greedy_batch_with_accepted_runs_is_plain_decoding(reference, k):
    plain, results, cycles, spec = oracle_lanes(reference, k, [14, 9, 11])
    for (want, want_state, want_logits), (got, state, logits) in zip(plain, results):
        assert got == want
        same_state(state, want_state, REF_TOL)
        np.testing.assert_allclose(logits, want_logits, rtol=REF_TOL, atol=REF_TOL)
    assert spec.accepted >= 3 and spec.accepted < spec.drafted


def test_reference_max_tokens_inside_an_accepted_run(reference):
    k = 3
    _, results, cycles, _ = oracle_lanes(reference, k, [30, 30, 30])
    before = 1
    for row in cycles:
        if row[0].accepted >= 2:
            break
        before += row[0].kept
    else:
        pytest.fail("no cycle accepted two drafts")
    plain, results, _, _ = oracle_lanes(reference, k, [before + 1, 5, 7])
    for (want, want_state, want_logits), (got, state, logits) in zip(plain, results):
        assert got == want
        same_state(state, want_state, REF_TOL)
        np.testing.assert_allclose(logits, want_logits, rtol=REF_TOL, atol=REF_TOL)


# the native verify runs a sequence's rows as one batched step, whose kernels may sum in another order than decode's
NATIVE_TOL = 1e-4


@pytest.mark.parametrize("k", [1, 3])
def test_native_greedy_batch_with_accepted_runs_is_native_plain_decoding(native, k):
    plain, results, cycles, spec = oracle_lanes(native, k, [14, 9, 11])
    for (want, want_state, want_logits), (got, state, logits) in zip(plain, results):
        assert got == want
        same_state(state, want_state, NATIVE_TOL)
        np.testing.assert_allclose(logits, want_logits, rtol=NATIVE_TOL, atol=NATIVE_TOL)
    assert spec.accepted >= 3 and spec.accepted < spec.drafted


def test_native_max_tokens_inside_an_accepted_run(native):
    _, _, cycles, _ = oracle_lanes(native, 3, [30, 30, 30])
    before = 1
    for row in cycles:
        if row[0].accepted >= 2:
            break
        before += row[0].kept
    else:
        pytest.fail("no cycle accepted two drafts")
    plain, results, _, _ = oracle_lanes(native, 3, [before + 1, 5, 7])
    for (want, want_state, want_logits), (got, state, logits) in zip(plain, results):
        assert got == want
        same_state(state, want_state, NATIVE_TOL)
        np.testing.assert_allclose(logits, want_logits, rtol=NATIVE_TOL, atol=NATIVE_TOL)


def test_bench_decode_speculative_reports_both_speeds_and_the_rollback_bytes(mtp_model, native):
    import json

    from tests.conftest import fermium_cli
    proc = fermium_cli("bench", "decode", "--model", mtp_model.path, "--speculative", "mtp", "--draft-tokens", "3",
                       "--accept-rate", "0.8", "--batch", "2", "--tokens", "6", "--rounds", "2", "--threads", "1",
                       "--kv-type", "f32", "--json")
    r = json.loads(proc.stdout)
    assert len(r["rounds"]) == 2 and r["median_spec_tok_s"] > 0 and r["median_plain_tok_s"] > 0
    assert all(x["ratio"] == pytest.approx(x["spec_tok_s"] / x["plain_tok_s"]) for x in r["rounds"])
    # forced at 0.8 a draft up to the first refusal: 0.8 + 0.64 + 0.512 of 3 a cycle, about 0.65
    assert all(0.3 < x["acceptance"] < 0.95 and x["tokens_per_cycle"] > 1.3 for x in r["rounds"])
    assert r["rollback_bytes_per_sequence"] == native.rollback_bytes(3)
    refused = fermium_cli("bench", "decode", "--model", mtp_model.path, "--speculative", "mtp", "--draft-tokens", "4",
                          check=False)
    assert refused.returncode == 2 and "--draft-tokens 4" in refused.stderr


def test_the_cycles_sample_is_samplers_token_for_token():
    from common.speculative_accept import sample
    rng = np.random.default_rng(7)
    for _ in range(200):
        row = (rng.normal(size=50) * 3).astype(np.float32)
        row[rng.integers(50, size=3)] = row.max()                       # ties: the first one wins in both
        if rng.random() < 0.2:
            row[rng.integers(50)] = np.nan
        if rng.random() < 0.1:
            row[rng.integers(50)] = np.inf
        for params in (SamplingParams(), SamplingParams(logit_bias={3: 50.0}), SamplingParams(repetition_penalty=2.0)):
            history = [3, 4, 4]
            assert sample(Sampler(params), row, history) == Sampler(params).sample(row, history)


@pytest.fixture(scope="module")
def demo_native():
    from common.model.default import default_model_path
    from common.model.gguf_file import GGUFModel
    from native.cpu_runner import CpuRunner
    model = GGUFModel(default_model_path())
    return model, CpuRunner(model, threads=1)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_generate_on_the_demo_model_is_plain_generate_whatever_cycle_max_tokens_ends_in(demo_native, k):
    """The demo model's own MTP head drafts (it accepts a good share); `fermium generate`'s loop
    yields every token of the cycle that reached max_tokens, and the tokens are plain decoding's."""
    from common.reference.generate import generate
    from common.speculative import Speculator
    _, runner = demo_native
    prompt = [100, 200]
    for max_tokens in (1, 2, 7, 30):
        plain = list(generate(runner, prompt, SamplingParams(), max_tokens))
        spec = Speculator(runner, k)
        fast = list(generate(runner, prompt, SamplingParams(), max_tokens, speculator=spec))
        assert fast == plain, (k, max_tokens)
        assert len(fast) == max_tokens
    assert spec.accepted > 0


def two_sample_chi2(a: dict, b: dict) -> tuple[float, int]:
    """Pearson's statistic that two equal-sized samples come from one distribution (cells with
    fewer than 2 * MIN_EXPECTED samples in all pooled), and its degrees of freedom."""
    cells = [c for c in set(a) | set(b) if a.get(c, 0) + b.get(c, 0) >= 2 * MIN_EXPECTED]
    rest = [c for c in set(a) | set(b) if c not in cells]
    obs = [(a.get(c, 0), b.get(c, 0)) for c in cells]
    pooled = (sum(a.get(c, 0) for c in rest), sum(b.get(c, 0) for c in rest))
    if sum(pooled) >= 2 * MIN_EXPECTED:
        obs.append(pooled)
    return sum((x - y) ** 2 / (x + y) for x, y in obs), len(obs) - 1


def test_demo_model_sampled_tokens_keep_their_distribution_under_speculation(demo_native):
    """Temperature 0.8 on the demo model and its own MTP head: the third token (the first that a
    verify decides against a draft; max_tokens leaves room for two) over 2,000 seeded runs with
    k = 2, against 2,000 runs of plain sampling with other seeds."""
    from common.reference.generate import generate
    from common.speculative import Speculator
    _, runner = demo_native
    prompt, n = [100, 200, 300], 2000
    spec = Speculator(runner, 2, auto_off=False)
    samples = {"spec": {}, "plain": {}}
    for seed in range(n):
        for kind, offset in (("spec", 0), ("plain", n)):
            params = SamplingParams(temperature=0.8, seed=seed + offset)
            out = list(generate(runner, prompt, params, 6, speculator=spec if kind == "spec" else None))
            samples[kind][out[2]] = samples[kind].get(out[2], 0) + 1
    stat, df = two_sample_chi2(samples["spec"], samples["plain"])
    assert df >= 10
    assert stat < chi2_critical(df), (stat, df)
    assert 0 < spec.accepted < spec.drafted          # both acceptance and rejection were exercised
