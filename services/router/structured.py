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
"""
from __future__ import annotations

import json
import logging
import threading

import llguidance as llg

from common.grammar import GrammarError, Vocab, compile_response_format, engine_tokenizer, validate
from common.tool_grammar import tool_call_grammar

from .errors import APIError, bad_request
from .tools import THINK_CLOSE, ToolPlan

log = logging.getLogger("fermium.router")


def warm(tokenizer: Vocab) -> threading.Thread:
    """Build the tokenizer's llguidance side off the event loop; a first grammar waits for it."""
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
            return tool_call_grammar(list(plan.tools), tokenizer, name=plan.name, started=plan.forced)
        spec = compile_response_format(body.get("response_format"), tokenizer)
        return think_first(spec, tokenizer) if spec and reasoning else spec
    except GrammarError as e:
        raise _bad(e) from None


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

