"""The rest of the surface clients send (issue #30): GET /v1/models/{id}, `echo` for completions,
and `usage.prompt_tokens_details.cached_tokens`, which on the real stack (the demo model, real
processes) covers nearly all of a repeated prompt (MIN_CACHED of it), in chat, completions, the final usage chunk
of a stream, and Anthropic's `cache_read_input_tokens`."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.model.default import default_model_path
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.frontend.api import API
from services.router.frontend.template import chat_renderer
from tests.agent_helpers import CONTEXT, MODEL, ScriptedDispatcher
from tests.test_api_errors import ByteTokenizer, lifespan
from tests.test_n_choices import stack  # noqa: F401  (a fixture)

MIN_CACHED = 0.9
STEM = "shakespeare-demo"


@pytest.fixture(scope="module")
def client():
    dispatcher, tok = ScriptedDispatcher(), ByteTokenizer()
    engine = Engine(tok, dispatcher, Admission(4, 4), RouterMetrics(), 30.0)
    api = API(engine, served=(MODEL, STEM), context=CONTEXT, vocab=tok.vocab_size, encode=tok.encode,
              decode=lambda ids: bytes(ids).decode("utf-8", "replace"), render=chat_renderer(None, False))
    with TestClient(api.app(lifespan=lifespan(dispatcher))) as c:
        c.dispatcher = dispatcher
        yield c


# ---- GET /v1/models/{id}
def test_a_served_model_by_id(client):
    listed = client.get("/v1/models").json()["data"][0]
    assert client.get(f"/v1/models/{MODEL}").json() == listed
    r = client.get(f"/v1/models/{STEM}")
    assert r.status_code == 200 and r.json() == {**listed, "id": STEM}


@pytest.mark.parametrize("name", ["gpt-4", "org/some-model", "fermium%20x"])
def test_another_model_is_openais_404(client, name):
    r = client.get(f"/v1/models/{name}")
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and error["type"] == "invalid_request_error"
    assert "does not exist" in error["message"] and "`fermium`" in error["message"]


# ---- echo
def complete(client, script: str, **kw) -> dict:
    client.dispatcher.script = script
    r = client.post("/v1/completions", json={"model": MODEL, "max_tokens": 50, **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("prompt", ["Once upon", ["Once upon"], list(b"Once upon")])
def test_echo_puts_the_prompt_before_the_answer(client, prompt):
    assert complete(client, " a time", prompt=prompt, echo=True)["choices"][0]["text"] == "Once upon a time"
    assert complete(client, " a time", prompt=prompt, echo=False)["choices"][0]["text"] == " a time"
    client.dispatcher.script = " a time"
    body = {"model": MODEL, "max_tokens": 50, "prompt": prompt, "echo": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == "Once upon" and chunks[0]["choices"][0]["finish_reason"] is None
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Once upon a time"


def test_echo_counts_no_tokens_and_is_checked(client):
    r = complete(client, "!", prompt="Hi", echo=True)
    assert r["usage"]["prompt_tokens"] == 2 and r["usage"]["completion_tokens"] == 1
    for field, value in (("echo", "yes"), ("suffix", "end")):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_usage_reports_cached_tokens_in_every_shape(client):
    client.dispatcher.script = "ok"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 5}
    assert client.post("/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens_details"] == \
        {"cached_tokens": 0}
    body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


# ---- cached_tokens on the real stack (tests.test_n_choices' stack fixture)


def heldout(n_chars: int) -> str:
    return (default_model_path().parent / "heldout_sample.txt").read_text()[:n_chars]


def test_a_repeated_prompt_is_served_from_the_snapshots(stack):  # noqa: F811
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": heldout(900)}]
    first = client.chat.completions.create(model="fermium", messages=messages, max_tokens=4, temperature=0).usage
    again = client.chat.completions.create(model="fermium", messages=messages, max_tokens=4, temperature=0).usage
    assert first.prompt_tokens_details.cached_tokens < first.prompt_tokens * MIN_CACHED
    assert again.prompt_tokens == first.prompt_tokens > 100
    assert again.prompt_tokens_details.cached_tokens >= MIN_CACHED * again.prompt_tokens
    stream = client.chat.completions.create(model="fermium", messages=messages, max_tokens=4, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    last = list(stream)[-1].usage
    assert last.prompt_tokens_details.cached_tokens >= MIN_CACHED * last.prompt_tokens

    prompt = heldout(700)
    body = {"model": "fermium", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).raise_for_status()
    usage = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= MIN_CACHED * usage["prompt_tokens"]


def test_anthropic_cache_read_input_tokens_on_the_stack(stack):  # noqa: F811
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="fermium", max_tokens=4, extra_body={"temperature": 0}, system="Speak as the players do.",
              messages=[{"role": "user", "content": heldout(800)}])
    client.messages.create(**kw)
    usage = client.messages.create(**kw).usage
    prompt = usage.input_tokens + usage.cache_read_input_tokens
    assert prompt > 100 and usage.cache_read_input_tokens >= MIN_CACHED * prompt
