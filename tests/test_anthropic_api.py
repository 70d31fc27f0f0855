"""The Anthropic Messages API (issue #30): the official anthropic client against a real uvicorn
router, whose dispatcher answers with scripted Qwen3.6 output (tests/agent_helpers.py): text,
thinking and tool_use blocks whole and streamed, the tool_result round rendered as the chat
template renders the same OpenAI conversation, stop reasons, usage, errors in Anthropic's shape,
and the API key sent as x-api-key."""
from __future__ import annotations

import contextlib
import json
import random

import httpx
import pytest

from common.model.chat_template import render_chat
from common.protocol.router import Failed, PrefillDone, Tokens
from services.router.frontend.auth import api_key_middleware
from tests.agent_helpers import (
    CONTEXT,
    GEN_NO_THINK,
    GEN_THINK,
    MODEL,
    PARIS_ARGS,
    WEATHER,
    ScriptedDispatcher,
    agent_client,
    call_text,
    make_api,
)
from tests.hostile_cases import _value
from tests.http_helpers import serve_app
from tests.test_api_errors import lifespan

anthropic = pytest.importorskip("anthropic")

KEY = "sk-ant-fermium-test"
TOOL = {"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER["function"]["parameters"]}
PARIS = call_text("get_weather", city="Paris", days=3)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@contextlib.contextmanager
def serving(dispatcher: ScriptedDispatcher, api_key: str | None = None):
    """A real router on loopback; yields its base URL."""
    with serve_app(make_api(dispatcher).app(lifespan=lifespan(dispatcher),
                                            middleware=api_key_middleware(api_key))) as url:
        yield url


@pytest.fixture(scope="module")
def served():
    dispatcher = ScriptedDispatcher()
    with serving(dispatcher, KEY) as url:
        yield dispatcher, anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=30), url


@pytest.fixture(scope="module")
def client():
    with agent_client() as c:
        yield c


def messages(client, script: str, **kw):
    client.dispatcher.script = script
    return client.post("/v1/messages", json={"model": MODEL, "max_tokens": 500, "messages": ASK, **kw})


def events(client, script: str, **kw) -> list[tuple[str, dict]]:
    """(event name, data) of a streamed answer, each data's type checked against its name."""
    client.dispatcher.script = script
    body = {"model": MODEL, "max_tokens": 500, "messages": ASK, "stream": True, **kw}
    with client.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    out = [(lines[i][len("event: "):], json.loads(lines[i + 1][len("data: "):])) for i in range(0, len(lines), 2)]
    assert all(data["type"] == name for name, data in out)
    return out


# ---- the official client
def test_text_whole_and_streamed(served):
    dispatcher, api, _ = served
    dispatcher.script = script = "Short.\n</think>\n\nIt is sunny."
    m = api.messages.create(model=MODEL, max_tokens=200, messages=ASK)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Short." and m.content[1].text == "It is sunny."
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.input_tokens == len(dispatcher.jobs[-1].prompt_ids) and m.usage.output_tokens == len(script)
    with api.messages.stream(model=MODEL, max_tokens=200, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "It is sunny." and final.content[0].thinking == "Short." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(script)


def test_thinking_and_tool_use_whole_and_streamed(served):
    dispatcher, api, _ = served
    dispatcher.script = "Weather needed.\n</think>\n\nLet me look.\n\n" + PARIS
    kw = dict(model=MODEL, max_tokens=500, messages=ASK, tools=[TOOL], thinking={"type": "enabled",
                                                                               "budget_tokens": 2048})
    whole = api.messages.create(**kw)
    with api.messages.stream(**kw) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_message()
    for m in (whole, streamed):
        assert [b.type for b in m.content] == ["thinking", "text", "tool_use"] and m.stop_reason == "tool_use"
        assert m.content[0].thinking == "Weather needed." and m.content[0].signature == ""
        assert m.content[1].text == "Let me look."
        call = m.content[2]
        assert call.id.startswith("toolu_") and call.name == "get_weather"
        assert call.input == {"city": "Paris", "days": 3}
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds
    assert dispatcher.prompt().endswith(GEN_THINK) and "<tools>" in dispatcher.prompt()


def test_the_tool_result_round_is_rendered_as_the_template_says(served):
    dispatcher, api, _ = served
    dispatcher.script = "Mild.\n</think>\n\nParis is 18 C."
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two cities, two calls.", "signature": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": json.loads(PARIS_ARGS)},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "-2 C"}],
             "is_error": False}]}]
    m = api.messages.create(model=MODEL, max_tokens=200, system=[{"type": "text", "text": "Be brief."}],
                            messages=conversation, tools=[TOOL])
    assert m.content[-1].text == "Paris is 18 C."
    openai_round = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": None, "reasoning_content": "Two cities, two calls.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": json.loads(PARIS_ARGS)}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "18 C"}, {"role": "tool", "content": "-2 C"}]
    assert dispatcher.prompt() == render_chat(openai_round, tools=[WEATHER])
    assert "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n-2 C\n</tool_response>" in dispatcher.prompt()


def test_the_api_key_as_x_api_key_or_bearer(served):
    dispatcher, _, url = served
    dispatcher.script = "x</think>ok"
    bearer = anthropic.Anthropic(base_url=url, auth_token=KEY, api_key=None, max_retries=0, timeout=30)
    assert bearer.messages.create(model=MODEL, max_tokens=20, messages=ASK).content[-1].text == "ok"
    wrong = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=MODEL, max_tokens=20, messages=ASK)
    assert e.value.status_code == 401 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"
    body = {"model": MODEL, "max_tokens": 20, "messages": ASK}
    r = httpx.post(f"{url}/v1/messages", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/chat/completions", headers={"x-api-key": KEY},
                   json={"model": MODEL, "max_tokens": 5, "messages": ASK})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"      # either header, on every route


def test_client_errors_are_typed(served):
    _, api, _ = served
    with pytest.raises(anthropic.NotFoundError) as e:
        api.messages.create(model="claude-x", max_tokens=20, messages=ASK)
    assert e.value.body["error"] == {"type": "not_found_error", "message": e.value.body["error"]["message"]}
    assert "claude-x" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        api.messages.create(model=MODEL, max_tokens=20, messages=ASK, tools=[{"name": "bad name", "input_schema": {}}])
    assert "tools[0].name" in e.value.body["error"]["message"]


def test_count_tokens_is_the_prompt_of_the_same_request(served):
    dispatcher, api, _ = served
    dispatcher.script = "x</think>ok"
    kw = dict(model=MODEL, messages=ASK, tools=[TOOL], system="Be brief.")
    counted = api.messages.count_tokens(**kw).input_tokens
    api.messages.create(max_tokens=10, **kw)
    assert counted == len(dispatcher.jobs[-1].prompt_ids)


# ---- the wire, event by event
def test_the_stream_events_in_order(client):
    got = events(client, "Hm.\n</think>\n\nHi." + PARIS, tools=[TOOL])
    names = [n for n, _ in got]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = got[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == len(client.dispatcher.jobs[-1].prompt_ids)
    blocks = [d["content_block"] for n, d in got if n == "content_block_start"]
    assert blocks[0] == {"type": "thinking", "thinking": "", "signature": ""} and blocks[1] == {"type": "text",
                                                                                                "text": ""}
    assert blocks[2]["type"] == "tool_use" and blocks[2]["input"] == {} and blocks[2]["name"] == "get_weather"
    opened: list[int] = []
    for name, data in got:                           # each block opens, gets deltas and closes, in order
        if name == "content_block_start":
            assert data["index"] == len(opened) and (not opened or opened[-1] is None)
            opened.append(data["index"])
        elif name == "content_block_delta":
            assert opened and opened[-1] == data["index"]
        elif name == "content_block_stop":
            assert opened[-1] == data["index"]
            opened[-1] = None
    partial = "".join(d["delta"]["partial_json"] for n, d in got if n == "content_block_delta" and d["index"] == 2)
    assert json.loads(partial) == {"city": "Paris", "days": 3}
    assert got[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert got[-2][1]["usage"]["output_tokens"] == len(("Hm.\n</think>\n\nHi." + PARIS).encode())


@pytest.mark.parametrize("kw, script, reason, sequence", [
    ({"stop_sequences": ["STOP"]}, "a</think>before STOP after", "stop_sequence", "STOP"),
    ({"max_tokens": 12}, "a</think>a long answer here", "max_tokens", None),
    ({"max_tokens": 40, "tools": [TOOL]}, "x</think>\n\n" + PARIS, "max_tokens", None),
    ({}, "a</think>done", "end_turn", None)])
def test_stop_reasons(client, kw, script, reason, sequence):
    m = messages(client, script, **kw).json()
    assert m["stop_reason"] == reason and m["stop_sequence"] == sequence
    assert events(client, script, **kw)[-2][1]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}


def test_a_coding_agents_request_is_taken_as_it_comes(client):
    cached = {"cache_control": {"type": "ephemeral"}}
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
              "properties": {"command": {"type": "string", "description": "The command"}}, "required": ["command"]}
    body = {"model": MODEL, "max_tokens": 32000, "stream": True, "temperature": 1,
            "metadata": {"user_id": "user_abc"}, "thinking": {"type": "enabled", "budget_tokens": 31999},
            "system": [{"type": "text", "text": "You are an agent.", **cached},
                       {"type": "text", "text": "Be careful."}],
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": schema, **cached}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                             {"type": "text", "text": "List files", **cached}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "ls", "signature": "sig"},
                                                  {"type": "tool_use", "id": "toolu_9", "name": "Bash",
                                                   "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "a.py",
                                              **cached}]}]}
    client.dispatcher.script = "Done.</think>\n\nOne file: a.py."
    with client.stream("POST", "/v1/messages?beta=true", json=body) as r:
        assert r.status_code == 200
        text = "".join(json.loads(line[6:])["delta"].get("text", "") for line in r.iter_lines()
                       if line.startswith("data: ") and '"content_block_delta"' in line)
    assert text == "One file: a.py."
    prompt = client.dispatcher.prompt()
    assert "You are an agent.\n\nBe careful." in prompt and "<tool_response>\na.py\n</tool_response>" in prompt
    assert "<system-reminder>x</system-reminder>\n\nList files" in prompt


def test_a_max_tokens_past_the_context_is_cut_to_it(client):
    client.dispatcher.script = "a</think>" + "x" * CONTEXT
    m = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 64000, "messages": ASK}).json()
    job = client.dispatcher.jobs[-1]
    assert len(job.prompt_ids) + job.max_tokens == CONTEXT
    assert m["stop_reason"] == "model_context_window_exceeded" and m["usage"]["output_tokens"] == job.max_tokens
    r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 64000, "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"    # OpenAI's stays


def test_thinking_disabled_and_tool_choice(client):
    messages(client, "Hello.", thinking={"type": "disabled"})
    assert client.dispatcher.prompt().endswith(GEN_NO_THINK)
    rest = PARIS[PARIS.index("<parameter="):]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = messages(client, rest, tools=[TOOL], tool_choice=choice).json()
        assert client.dispatcher.prompt().endswith(GEN_NO_THINK + "<tool_call>\n<function=get_weather>\n")
        assert m["content"][-1]["input"] == {"city": "Paris", "days": 3} and m["stop_reason"] == "tool_use"
    m = messages(client, "x</think>" + PARIS, tools=[TOOL], tool_choice={"type": "none"}).json()
    assert m["content"][1:] == [{"type": "text", "text": PARIS}] and m["stop_reason"] == "end_turn"
    two = "x</think>" + PARIS + "\n" + call_text("get_weather", city="Oslo")
    single = {"type": "auto", "disable_parallel_tool_use": True}
    assert len(messages(client, two, tools=[TOOL], tool_choice=single).json()["content"]) == 2
    assert len(messages(client, two, tools=[TOOL]).json()["content"]) == 3


def test_a_last_assistant_turn_is_continued(client):
    prefilled = ASK + [{"role": "assistant", "content": [{"type": "text", "text": "The answer is ("}]}]
    m = messages(client, "B) Helios", messages=prefilled).json()
    assert client.dispatcher.prompt().endswith(GEN_NO_THINK + "The answer is (")
    assert m["content"] == [{"type": "text", "text": "B) Helios"}] and m["stop_reason"] == "end_turn"
    streamed = events(client, "B) Helios", messages=prefilled)
    assert "".join(d["delta"].get("text", "") for n, d in streamed if n == "content_block_delta") == "B) Helios"
    n = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": prefilled}).json()
    assert n["input_tokens"] == len(client.dispatcher.jobs[-1].prompt_ids)


class CachedDispatcher(ScriptedDispatcher):
    """Reports `cached` prompt tokens: the dispatcher's hit, then prefill's count of what it prefilled."""

    def __init__(self, cached: int, prefilled: int | None = None, fail: bool = False):
        super().__init__()
        self.cached, self.prefilled, self.fail = cached, prefilled, fail

    def submit(self, job, stop_ids):
        track = super().submit(job, stop_ids)
        track.cached = self.cached
        if self.prefilled is not None:
            track.events.put_nowait(PrefillDone(track.rid, "p", self.prefilled, 0.0))
        return track

    async def _play(self, track, tokens, reason):
        if not self.fail:
            return await super()._play(track, tokens, reason)
        track.events.put_nowait(Tokens(track.rid, tokens[:8]))
        track.events.put_nowait(Failed(track.rid, "d", "decode worker lost"))


@pytest.mark.parametrize("cached, prefilled", [(40, None), (0, 5)])
def test_cache_read_input_tokens(cached, prefilled):
    dispatcher = CachedDispatcher(cached, prefilled)
    dispatcher.script = "a</think>hi"
    with serving(dispatcher) as url:
        api = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=30)
        m = api.messages.create(model=MODEL, max_tokens=20, messages=ASK)
        n = len(dispatcher.jobs[-1].prompt_ids)
        want = cached if prefilled is None else n - prefilled
        assert m.usage.cache_read_input_tokens == want and m.usage.input_tokens == n - want
        with api.messages.stream(model=MODEL, max_tokens=20, messages=ASK) as stream:
            assert stream.get_final_message().usage.cache_read_input_tokens == want
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 5, "messages": ASK})
        assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": want}


def test_a_failure_mid_stream_is_an_error_event():
    dispatcher = CachedDispatcher(0, fail=True)
    dispatcher.script = "a</think>" + "x" * 40
    with serving(dispatcher) as url:
        api = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(anthropic.APIStatusError) as e:
            with api.messages.stream(model=MODEL, max_tokens=100, messages=ASK) as stream:
                for _ in stream:
                    pass
        assert "decode worker lost" in str(e.value)
        with pytest.raises(anthropic.InternalServerError) as e:
            api.messages.create(model=MODEL, max_tokens=100, messages=ASK)
        assert e.value.body["error"]["type"] == "api_error"


# ---- bad requests
@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"model": None}, "model"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "a"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": "The answer is"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}]},
     "messages[0].content[0].input"),
    ({"system": [{"type": "image"}]}, "system[0]"),
    ({"temperature": 1.5}, "temperature"),
    ({"stop_sequences": "STOP"}, "stop_sequences"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema.type"),
    ({"tool_choice": {"type": "tool"}, "tools": [TOOL]}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [TOOL]}, "tool_choice.name"),
    ({"tool_choice": "auto"}, "tool_choice.type"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x" * CONTEXT}]}, "messages"),
])
def test_bad_requests_name_the_field(client, extra, param):
    body = {k: v for k, v in {"model": MODEL, "max_tokens": 50, "messages": ASK, **extra}.items() if v is not None}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert param in r.json()["error"]["message"], r.json()


def test_other_errors_keep_anthropics_shape(client):
    r = client.post("/v1/messages", content=b"{oops")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = client.post("/v1/messages", json={"model": "claude-x", "max_tokens": 5, "messages": ASK})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": "hi"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_hostile_bodies_never_fail_the_server(client):
    rng = random.Random(30)
    client.dispatcher.script = "a</think>b"
    fields = ("model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "stop_sequences",
              "temperature", "stream", "metadata")
    for _ in range(400):
        body = {"model": MODEL, "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "tool_result", "tool_use_id": "t"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": "b"}]}
        target = body if rng.random() < 0.5 else rng.choice(body["messages"][rng.randrange(2)]["content"])
        target[rng.choice(fields + ("type", "content", "input", "text", "id", "name"))] = _value(rng)
        try:
            data = json.dumps(body).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            continue
        r = client.post(rng.choice(("/v1/messages", "/v1/messages/count_tokens")), content=data)
        assert r.status_code < 500, (body, r.text)
        if r.status_code != 200:
            assert r.json()["type"] == "error" and set(r.json()["error"]) == {"type", "message"}
