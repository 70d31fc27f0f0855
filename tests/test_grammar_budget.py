"""A costly json_schema must not stall the decode batch (issue 42, case 1), on real processes
(router, prefill and decode on the demo model): with the router's first-mask check off, costly
patterns reach decode, whose masks are filled off the loop and timed per sequence; each ends with
a short error naming the budget while a plain 300-token stream beside them keeps its pace
(tools/bench_grammar_budget.py times it with repeats). The router's own check refuses the same
pattern with a 400 naming the field; no message shows the grammar engine's state."""
from __future__ import annotations

import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from fermium.stack import Stack, free_port
from services.router.frontend.errors import APIError
from services.router.frontend.structured import request_grammar, warm
from services.router.frontend.tools import ToolPlan
from tools.bench_grammar_budget import PLAIN_TOKENS, beside, costly_format, plain_stream

READY_TIMEOUT_S = 60
SLOWDOWN, SLACK_S = 4.0, 3.0           # the goal is 1.2x; margin for a loaded two-core host (before: 30x and more)
INTERNALS = ("<state>", "Parser", "lexer", "llguidance", "Traceback")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(GGUFModel(default_model_path()))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with Stack(str(default_model_path()), port=free_port(), runner="reference",
               extra={"router": ["--grammar-first-mask-ms", "0"], "decode": ["--grammar-step-budget-ms", "100"]},
               log_dir=tmp_path_factory.mktemp("stack")) as s:
        s.wait_ready(READY_TIMEOUT_S)
        yield s.url


def test_costly_grammars_end_alone_and_the_batch_keeps_its_pace(url, tok):
    eos = sorted(tok.eos_ids)
    plain_stream(url, eos)             # warm
    first, tokens = plain_stream(url, eos)
    assert tokens == PLAIN_TOKENS
    one, tokens1, replies1 = beside(url, eos, 1)
    three, tokens3, replies3 = beside(url, eos, 3)
    alone = min(first, plain_stream(url, eos)[0])         # a loaded host: the better of two
    control, _, _ = beside(url, eos, 3, None)
    print(f"\nplain {PLAIN_TOKENS}-token stream: alone {alone:.2f} s, beside one costly grammar {one:.2f} s "
          f"({one / alone:.2f}x), beside three {three:.2f} s ({three / alone:.2f}x); beside three one-token "
          f"chats without a grammar {control:.2f} s ({control / alone:.2f}x)")
    assert tokens1 == tokens3 == PLAIN_TOKENS
    assert len(replies1) == 1 and len(replies3) == 3
    for r in replies1 + replies3:
        assert r.status_code == 500, r.text
        message = r.json()["error"]["message"]
        assert "--grammar-step-budget-ms" in message and len(message) < 200, message
        assert not any(word in message for word in INTERNALS), message
    assert one < alone * SLOWDOWN + SLACK_S
    assert three < alone * SLOWDOWN + SLACK_S


def test_the_router_refuses_a_costly_grammar_naming_the_field(tok):
    warm(tok, 0.05).join()
    try:
        with pytest.raises(APIError) as e:
            request_grammar({"response_format": costly_format()}, ToolPlan(), tok, False)
        assert e.value.status == 400 and e.value.param == "response_format.json_schema.schema"
        assert "too costly" in e.value.message and not any(w in e.value.message for w in INTERNALS)
        cheap = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
        assert request_grammar({"response_format": cheap}, ToolPlan(), tok, False)
    finally:
        warm(tok).join()
