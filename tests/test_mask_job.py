"""Grammar masks off decode's loop (issue 42, case 1), in one process: a mask filled by
common.mask_job equals the one filled inline and its work is CPU time; a job given up on drops
its thread to the lowest priority and the pool replaces it, and past a bound of such threads a
new mask fails at once; decode's MaskPool fails a sequence
past either budget; and a decode batch with a costly grammar beside plain and cheap ones ends the
costly one alone, with a short message, while the others sample exactly what they sample alone.
Errors of the grammar engine reach no one with its parser state."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from common import grammar
from common.mask_job import MAX_ABANDONED, MaskJob, MasksBusy, MaskWorkers
from common.model.default import default_model_path
from common.protocol.decode import DecodeRequest
from common.sampling import SamplingParams
from common.state import state_specs
from services.decode.config import DecodeConfig
from services.decode.mask_ahead import Ahead, GrammarBudget, MaskPool
from services.decode.server import DecodeServer
from tests.stack_helpers import each_reply
from tests.test_structured_output import DIGITS, RandomRunner
from tools.bench_grammar_budget import COSTLY, costly_format


def matcher(tok, response_format) -> grammar.Matcher:
    spec = grammar.compile_response_format(response_format, tok)
    return grammar.Matcher(spec, grammar.engine_tokenizer(tok))


def digits():
    return {"type": "json_schema", "json_schema": {"name": "d", "schema": DIGITS}}


def test_a_job_fills_the_mask_inline_filling_gives(tok):
    workers = MaskWorkers(2, "test-mask")
    try:
        job = MaskJob(matcher(tok, digits()), tok.vocab_size)
        workers.submit(job)
        assert job.done.wait(30) and job.error is None
        inline = grammar.allowed(grammar.fill_masks([matcher(tok, digits())], tok.vocab_size)[0], tok.vocab_size)
        assert np.array_equal(job.mask, inline) and 0 < job.mask.sum() < tok.vocab_size
        assert 0 < job.seconds == job.work()
    finally:
        workers.close()


def test_a_job_given_up_on_runs_at_the_lowest_priority_and_its_thread_leaves(tok):
    workers = MaskWorkers(1, "test-mask")
    try:
        job = MaskJob(matcher(tok, costly_format()), tok.vocab_size)
        workers.submit(job)
        while not job.tid:
            time.sleep(0.001)
        workers.demote(job)
        assert job.lowered and os.sched_getscheduler(job.tid) == os.SCHED_IDLE
        queued = MaskJob(matcher(tok, digits()), tok.vocab_size)
        workers.submit(queued)                          # a fresh worker takes it at once
        assert queued.done.wait(30) and queued.error is None and not job.done.is_set()
        gone = MaskJob(matcher(tok, digits()), tok.vocab_size)
        gone.demote()                                   # given up on before it began: never filled
        gone.run()
        assert gone.done.is_set() and gone.mask is None
    finally:
        workers.close()


def test_masks_given_up_on_are_bounded_and_a_new_one_fails_at_once_past_them(tok):
    """Each abandoned mask keeps its grammar's memory until it ends: past MAX_ABANDONED of them
    still running, a new mask fails at once (MasksBusy) instead of adding another; once they end,
    masks are filled again."""
    workers = MaskWorkers(1, "test-mask")
    try:
        costly = [MaskJob(matcher(tok, costly_format()), tok.vocab_size) for _ in range(MAX_ABANDONED)]
        for job in costly:
            workers.submit(job)
            while not job.tid:
                time.sleep(0.001)
            workers.demote(job)
        assert workers.abandoned == MAX_ABANDONED
        refused = MaskJob(matcher(tok, digits()), tok.vocab_size)
        workers.submit(refused)
        assert refused.done.wait(5) and isinstance(refused.error, MasksBusy) and refused.mask is None
        assert all(job.done.wait(120) for job in costly)
        deadline = time.monotonic() + 10
        while workers.abandoned and time.monotonic() < deadline:
            time.sleep(0.01)
        assert workers.abandoned == 0
        served = MaskJob(matcher(tok, digits()), tok.vocab_size)
        workers.submit(served)
        assert served.done.wait(30) and served.error is None and served.mask.any()
    finally:
        workers.close()


def test_decode_fails_a_grammar_past_either_budget(tok):
    for step, total, flag in ((0.02, 60.0, "--grammar-step-budget-ms"), (60.0, 0.02, "--grammar-request-budget-s")):
        pool = MaskPool(tok.vocab_size, 2, step, total)
        try:
            ahead = Ahead(matcher(tok, costly_format()))
            pool.submit(ahead)
            deadline = time.monotonic() + 60
            with pytest.raises(GrammarBudget, match=flag):
                while time.monotonic() < deadline:
                    assert pool.poll(ahead) is None
                    time.sleep(0.005)
            assert ahead.job.demoted
        finally:
            pool.close()


def test_engine_errors_lose_the_parser_state():
    dump = "lexer error: too many expressions constructed\n<state>\nTokens: ⟦{\"⟧\nParser: {\"rows\": 4}"
    assert grammar.short_error(dump) == "lexer error: too many expressions constructed"
    assert grammar.short_error("") == "the grammar engine failed"
    with pytest.raises(grammar.GrammarError) as e:
        grammar.validate("start: /(/", None)
    assert "unclosed group" in str(e.value) and "<state>" not in str(e.value)


def run(model, tok, requests: dict[str, SamplingParams], budget_ms: float) -> tuple[dict, dict]:
    """Each request decoded on one DecodeServer: ({rid: tokens}, {rid: failure})."""
    cfg = model.config
    server = DecodeServer(DecodeConfig(str(default_model_path()), router="tcp://127.0.0.1:9", max_batch=8,
                                       kv_type="f32", grammar_step_budget_ms=budget_ms),
                          model=model, runner=RandomRunner(cfg.vocab_size))
    tokens, failed = {rid: [] for rid in requests}, {}
    server.link.send = lambda m: [tokens[s.rid].extend(s.tokens) for s in each_reply([m]) if hasattr(s, "tokens")]
    server.link.fail = lambda rid, why: failed.__setitem__(rid, why)
    state = [np.zeros(shape, dtype) for _, dtype, shape in state_specs(2, cfg, "f32")]
    try:
        for rid, params in requests.items():
            first = np.random.default_rng(list(rid.encode())).normal(size=cfg.vocab_size).astype(np.float32) * 3
            server.link._queue.put(DecodeRequest(rid, 2, [5, 6], params, 60, [], False, state, first, "f32"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            server.step(timeout=0)
            if not len(server.sched) and server.link._queue.empty():
                break
    finally:
        server.close()
    return tokens, failed


def test_a_costly_grammar_ends_alone_and_the_batch_samples_as_without_it(model, tok):
    cheap = grammar.compile_response_format(digits(), tok)
    costly = grammar.compile_response_format(costly_format(), tok)
    plain = {"plain": SamplingParams(temperature=1, seed=3), "cheap": SamplingParams(grammar=cheap, seed=4)}
    alone, none = run(model, tok, plain, budget_ms=1000)
    beside, failed = run(model, tok, {**plain, "costly": SamplingParams(grammar=costly, seed=5)}, budget_ms=50)
    assert not none and list(failed) == ["costly"], failed
    assert "--grammar-step-budget-ms" in failed["costly"] and "\n" not in failed["costly"]
    assert beside["plain"] == alone["plain"] and len(alone["plain"]) == 60
    assert beside["cheap"] == alone["cheap"]
    assert COSTLY not in failed["costly"]


def test_the_router_answers_a_retryable_429_while_its_masks_are_busy(tok, monkeypatch):
    from services.router.frontend import structured
    from services.router.frontend.errors import APIError
    from services.router.frontend.tools import ToolPlan
    monkeypatch.setattr(structured._masks, "abandoned", MAX_ABANDONED)
    body = {"response_format": digits()}
    with pytest.raises(APIError) as got:
        structured.request_grammar(body, ToolPlan(), tok, reasoning=False)
    assert got.value.status == 429 and got.value.code == "grammar_busy" and "Retry-After" in got.value.headers
    monkeypatch.setattr(structured._masks, "abandoned", 0)
    assert structured.request_grammar(body, ToolPlan(), tok, reasoning=False)
