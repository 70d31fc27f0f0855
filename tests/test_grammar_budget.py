"""A costly json_schema must not stall the decode batch (issue 42, case 1), on real processes
(router, prefill and decode on the demo model): with the router's first-mask check off, costly
patterns reach decode, whose masks are filled off the loop and timed per sequence; each ends with
a short error naming the budget while a plain 300-token stream beside them keeps its pace. The
router's own check refuses the same pattern with a 400 naming the field, and a grammar its engine
gives up on never shows the engine's state to the client."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from fermium.stack import Stack, free_port
from services.router.errors import APIError
from services.router.structured import request_grammar, warm
from services.router.tools import ToolPlan

READY_TIMEOUT_S = 60
PLAIN_TOKENS = 300
COSTLY = "^(a{500}){500}$"             # compiles at once; each mask then costs a tenth of a second or more
SLOWDOWN = 3.0                         # the goal is 1.2x; margin for a loaded two-core host
INTERNALS = ("<state>", "Parser", "lexer", "llguidance", "Traceback")


def costly_format(pattern: str = COSTLY) -> dict:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    return {"type": "json_schema", "json_schema": {"name": "costly", "schema": schema}}


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


def plain_stream(url: str, tok) -> tuple[float, int]:
    """Seconds and tokens of a 300-token completion stream that EOS cannot end."""
    body = {"model": "fermium", "prompt": "Once upon a time", "max_tokens": PLAIN_TOKENS, "temperature": 1,
            "seed": 7, "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": {str(t): -100 for t in tok.eos_ids}}
    t0, tokens = time.perf_counter(), 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return time.perf_counter() - t0, tokens


def costly(url: str, out: list, pattern: str = COSTLY) -> None:
    body = {"model": "fermium", "messages": [{"role": "user", "content": "Write a's."}], "max_tokens": 300,
            "response_format": costly_format(pattern), "chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    out.append(r)


def beside(url: str, tok, n: int) -> tuple[float, list[httpx.Response]]:
    replies: list = []
    threads = [threading.Thread(target=costly, args=(url, replies)) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.3)                    # the costly ones are at decode first
    seconds, tokens = plain_stream(url, tok)
    assert tokens == PLAIN_TOKENS
    for t in threads:
        t.join(300)
    return seconds, replies


def test_costly_grammars_end_alone_and_the_batch_keeps_its_pace(url, tok):
    plain_stream(url, tok)             # warm
    first, tokens = plain_stream(url, tok)
    assert tokens == PLAIN_TOKENS
    one, replies1 = beside(url, tok, 1)
    three, replies3 = beside(url, tok, 3)
    alone = min(first, plain_stream(url, tok)[0])         # a loaded host: the better of two
    print(f"\nplain {PLAIN_TOKENS}-token stream: alone {alone:.2f} s, beside one costly grammar {one:.2f} s "
          f"({one / alone:.2f}x), beside three {three:.2f} s ({three / alone:.2f}x)")
    for r in replies1 + replies3:
        assert r.status_code == 500, r.text
        message = r.json()["error"]["message"]
        assert "--grammar-step-budget-ms" in message and len(message) < 200, message
        assert not any(word in message for word in INTERNALS), message
    assert one < alone * SLOWDOWN + 1.0
    assert three < alone * SLOWDOWN + 1.0


def test_the_router_refuses_a_costly_grammar_naming_the_field(tok):
    warm(tok, 0.05).join()
    try:
        with pytest.raises(APIError) as e:
            request_grammar({"response_format": costly_format()}, ToolPlan(), tok, False)
        assert e.value.status == 400 and e.value.param == "response_format.json_schema.schema"
        assert "too costly" in e.value.message and not any(w in e.value.message for w in INTERNALS[:2])
        cheap = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
        assert request_grammar({"response_format": cheap}, ToolPlan(), tok, False)
    finally:
        warm(tok).join()
