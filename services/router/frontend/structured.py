"""A request's grammar, the SamplingParams.grammar spec decode enforces: a response_format
(json_object, json_schema with strict; common.grammar) or a forced tool call (tool_choice
"required" or named; common.tool_grammar), which wins when both are given, as the answer is then
the call. A grammar that does not compile is a 400 whose `param` is the schema path.

With thinking on, the answer opens inside the think block the template left open, and a grammar
applies from the first token, so a response_format grammar starts with free reasoning up to
`</think>` and then holds the rest to the schema: the model still reasons before it answers.
A forced call keeps the prompt steering of tools.py instead (the think block closed empty and
the call started), since the call's start is already in the prompt.

The grammars are checked against the router's tokenizer (its llguidance side is built once, in a
thread at router start, `warm`); without a tokenizer, a forced call is steered but not enforced.
A grammar's first mask is also filled here, in a worker thread (common.mask_job), and timed by its
CPU, so that one too costly for decode to follow (--grammar-first-mask-ms), or one its engine
gives up on, is a 400 naming the field, not a failure mid-stream; a mask given up on goes on at
the lowest priority.
"""
from __future__ import annotations

import json
import logging
import threading

import llguidance as llg

from common.grammar import (
    GrammarError,
    Matcher,
    Vocab,
    compile_response_format,
    engine_tokenizer,
    validate,
)
from common.mask_job import MaskJob, MasksBusy, MaskWorkers
from common.tool_grammar import tool_call_grammar

from .errors import APIError, bad_request
from .tools import THINK_CLOSE, ToolPlan

log = logging.getLogger("fermium.router")
GRAMMAR_FIRST_MASK_MS = 250.0      # far above a schema's first mask on a 248k vocabulary (tools/bench_grammar.py)
_first_mask_budget = [GRAMMAR_FIRST_MASK_MS / 1000]     # seconds; 0: not timed (set by warm)
MASK_THREADS = 4                   # first masks filled at once, demoted ones aside
POLL_S = 0.005
_masks = MaskWorkers(MASK_THREADS, "router-grammar-mask")


def warm(tokenizer: Vocab, first_mask_budget_s: float = GRAMMAR_FIRST_MASK_MS / 1000) -> threading.Thread:
    """Build the tokenizer's llguidance side off the event loop; a first grammar waits for it.
    `first_mask_budget_s` is the router's --grammar-first-mask-ms."""
    _first_mask_budget[0] = first_mask_budget_s
    def build() -> None:
        try:
            engine_tokenizer(tokenizer)
        except Exception:                 # a grammar request will report it; plain text still serves
            log.exception("router: the grammar tokenizer failed")
    thread = threading.Thread(target=build, name="router-grammar-tokenizer", daemon=True)
    thread.start()
    return thread


def request_grammar(body: dict, plan: ToolPlan, tokenizer: Vocab | None, reasoning: bool) -> str:
    """The grammar spec of a request ("" for none); `reasoning`: the answer opens in a think block."""
    try:
        if plan.forced:
            if tokenizer is None:
                return ""
            spec, where = tool_call_grammar(list(plan.tools), tokenizer, name=plan.name, started=plan.forced), "tools"
        else:
            spec = compile_response_format(body.get("response_format"), tokenizer)
            kind = (body.get("response_format") or {}).get("type")
            where = "response_format.json_schema.schema" if kind == "json_schema" else "response_format"
        if spec and tokenizer is not None and _first_mask_budget[0] > 0:   # the answer's, not the free reasoning's
            first_mask(spec, tokenizer, where, _first_mask_budget[0])
        return think_first(spec, tokenizer) if spec and reasoning and not plan.forced else spec
    except MasksBusy as e:
        raise APIError(429, str(e).removeprefix("grammar: "), type="rate_limit_error", code="grammar_busy",
                       headers={"Retry-After": "1"}) from None
    except GrammarError as e:
        raise _bad(e) from None


def first_mask(spec: str, tokenizer: Vocab, where: str, budget_s: float) -> float:
    """Seconds the grammar's first mask takes; GrammarError naming `where` past `budget_s` or when
    the engine fails on it."""
    job = MaskJob(Matcher(spec, engine_tokenizer(tokenizer)), tokenizer.vocab_size)
    _masks.submit(job)
    while not job.done.wait(POLL_S) and job.work() <= budget_s:
        pass
    seconds = job.work()
    if seconds > budget_s:
        _masks.demote(job)
        raise GrammarError(f"{where}: the grammar is too costly to follow: its first mask took over "
                           f"{budget_s * 1000:.0f} ms (the router's --grammar-first-mask-ms); simplify the schema")
    if isinstance(job.error, MasksBusy):
        raise job.error
    if job.error is not None:
        why = str(job.error).removeprefix("grammar: ")
        raise GrammarError(f"{where}: the grammar cannot be followed: {why}")
    return seconds


def think_first(spec: str, tokenizer: Vocab | None) -> str:
    """A response_format spec with free reasoning before it: `...</think>\\n\\n` then the JSON."""
    (entry,) = json.loads(spec)["grammars"]
    schema = json.dumps(entry["json_schema"])           # with llguidance's options under x-guidance
    tid = tokenizer.token_to_id(THINK_CLOSE) if tokenizer is not None else None
    if tid is not None and tokenizer.is_special(tid):  # a special token cannot end a lexeme by stop=
        rules = f"start: think <[{tid}]> answer\nthink: /(.|\\n)*/"
    else:
        rules = f"start: think answer\nthink[stop={json.dumps(THINK_CLOSE)}]: /(.|\\n)*/"
    return validate(llg.LLMatcher.grammar_from_lark(f'{rules}\nanswer: "\\n\\n" %json {schema}'), tokenizer,
                    "response_format")


def _bad(e: GrammarError) -> APIError:
    message = str(e)
    path = message.split(":", 1)[0] if ":" in message else "response_format"
    return bad_request(message, path if " " not in path else "response_format")

