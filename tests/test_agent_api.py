"""Reasoning and tool calls through the chat API (issue #30): the real API and Engine, the Qwen3.6
template, and scripted model output; the official openai client against a real uvicorn router."""
from __future__ import annotations

import json

import pytest

from tests.agent_helpers import (
    GEN_NO_THINK,
    GEN_THINK,
    MODEL,
    TIME,
    WEATHER,
    agent_client,
    call_text,
    joined,
    post,
    stream,
    stream_calls,
)

PARIS = call_text("get_weather", city="Paris", days=3)
OSLO = call_text("get_weather", city="Oslo")


@pytest.fixture(scope="module")
def client():
    with agent_client() as c:
        yield c


# ---- reasoning
def test_reasoning_is_split_from_content(client):
    r = post(client, "The user wants 4.\n</think>\n\nIt is 4.")
    assert client.dispatcher.prompt().endswith(GEN_THINK)
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "It is 4.",
                                          "reasoning_content": "The user wants 4."}
    assert r["choices"][0]["finish_reason"] == "stop"


def test_reasoning_streams_before_content(client):
    chunks = stream(client, "The user wants 4.\n</think>\n\nIt is 4.")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert joined(chunks, "reasoning_content") == "The user wants 4." and joined(chunks, "content") == "It is 4."
    kinds = [k for c in chunks[1:-1] for k in c["choices"][0]["delta"]]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning_content"), "no reasoning after content"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


@pytest.mark.parametrize("switch", [{"reasoning_effort": "none"},
                                    {"chat_template_kwargs": {"enable_thinking": False}}])
def test_thinking_off(client, switch):
    r = post(client, "Hello.", **switch)
    assert client.dispatcher.prompt().endswith(GEN_NO_THINK)
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "Hello."}


def test_other_reasoning_efforts_keep_thinking(client):
    post(client, "x</think>y", reasoning_effort="high")
    assert client.dispatcher.prompt().endswith(GEN_THINK)
    r = client.post("/v1/chat/completions", json={"model": MODEL, "reasoning_effort": "max",
                                                  "messages": [{"role": "user", "content": "a"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"


def test_reasoning_cut_by_the_token_limit(client):
    r = post(client, "Thinking at length about it", max_tokens=8)
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "", "reasoning_content": "Thinking"}
    assert r["choices"][0]["finish_reason"] == "length"


# ---- tool calls
def test_a_tool_call(client):
    r = post(client, "Weather needed.\n</think>\n\n" + PARIS, tools=[WEATHER])
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) in client.dispatcher.prompt()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "Weather needed."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}


def test_a_streamed_tool_call_sends_the_name_then_the_arguments(client):
    chunks = stream(client, "Weather needed.\n</think>\n\n" + PARIS, tools=[WEATHER])
    calls = stream_calls(chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris", "days": 3})]
    fragments = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert len(fragments) >= 3 and fragments[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == ""
    assert joined(chunks, "content") == "" and joined(chunks, "reasoning_content") == "Weather needed."
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("streamed", [False, True])
def test_several_calls_with_text_before_them(client, streamed):
    script = "x</think>\n\nLet me look both up.\n\n" + PARIS + "\n" + OSLO + "\n" + call_text("get_time")
    want = [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo"}), ("get_time", {})]
    if streamed:
        chunks = stream(client, script, tools=[WEATHER, TIME])
        calls, content = stream_calls(chunks), joined(chunks, "content")
    else:
        message = post(client, script, tools=[WEATHER, TIME])["choices"][0]["message"]
        calls, content = [{**c["function"], "id": c["id"]} for c in message["tool_calls"]], message["content"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == want
    assert content == "Let me look both up." and len({c["id"] for c in calls}) == 3


def test_parallel_tool_calls_false_keeps_the_first(client):
    r = post(client, "x</think>\n\n" + PARIS + "\n" + OSLO, tools=[WEATHER], parallel_tool_calls=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in r["choices"][0]["message"]["tool_calls"]] == \
        ["Paris"]
    assert [c["name"] for c in stream_calls(stream(client, "x</think>\n\n" + PARIS + "\n" + OSLO, tools=[WEATHER],
                                                   parallel_tool_calls=False))] == ["get_weather"]


def test_a_call_cut_by_the_token_limit_finishes_as_tool_calls(client):
    script = "x</think>\n\n" + PARIS
    r = post(client, script, tools=[WEATHER], max_tokens=script.index("<parameter=days>"))
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"          # as vLLM: a parsed call outranks "length"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


def test_malformed_calls_are_content_and_counted(client):
    before = client.metrics.registry.get_sample_value("fermium_tool_call_parse_failures_total")
    script = "x</think>\n\n" + call_text("launch_rockets", target="moon")
    r = post(client, script, tools=[WEATHER])
    assert r["choices"][0]["message"]["content"] == call_text("launch_rockets", target="moon")
    assert r["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in r["choices"][0]["message"]
    assert client.metrics.registry.get_sample_value("fermium_tool_call_parse_failures_total") > before


def test_a_stop_string_inside_a_call_closes_it(client):
    r = post(client, "x</think>\n\n" + PARIS, tools=[WEATHER], stop=["Paris"])
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == \
        "get_weather"
    r = post(client, "a</think>\n\nbefore STOP after", tools=[WEATHER], stop=["STOP"])
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "before ", "reasoning_content": "a"}


# ---- tool_choice
def test_tool_choice_none_leaves_calls_as_content(client):
    r = post(client, "x</think>\n\n" + PARIS, tools=[WEATHER], tool_choice="none")
    assert "<tools>" in client.dispatcher.prompt()
    assert r["choices"][0]["message"]["content"] == PARIS and r["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_call_starts_in_the_prompt(client, choice):
    tools = [WEATHER] if choice == "required" else [WEATHER, TIME]
    rest = PARIS[PARIS.index("<parameter="):]
    r = post(client, rest, tools=tools, tool_choice=choice)
    assert client.dispatcher.prompt().endswith(GEN_NO_THINK + "<tool_call>\n<function=get_weather>\n")
    choice_body = r["choices"][0]
    assert choice_body["finish_reason"] == ("tool_calls" if choice == "required" else "stop")   # OpenAI's, vLLM's
    assert json.loads(choice_body["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "days": 3}
    chunks = stream(client, rest, tools=tools, tool_choice=choice)
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(stream_calls(chunks)[0]["arguments"]) == {"city": "Paris", "days": 3}


def test_required_with_several_tools_lets_the_model_name_it(client):
    r = post(client, "get_time>\n</function>\n</tool_call>", tools=[WEATHER, TIME], tool_choice="required")
    assert client.dispatcher.prompt().endswith(GEN_NO_THINK + "<tool_call>\n<function=")
    assert r["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}


# ---- bad requests
def test_completions_stay_raw_text(client):
    client.dispatcher.script = "x</think>" + PARIS
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 500})
    assert r.json()["choices"][0]["text"] == "x</think>" + PARIS


@pytest.mark.parametrize("tools, param", [
    ({"type": "function"}, "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function", "function": "get_weather"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "get weather"}}], "tools[0].function.name"),
    ([WEATHER, {"type": "function", "function": {"name": ""}}], "tools[1].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "tools[0].function.description"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[0].function.parameters.type"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}],
     "tools[0].function.parameters.properties"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a>b": {}}}}}],
     "tools[0].function.parameters.properties"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}],
     "tools[0].function.parameters.required"),
])
def test_bad_tools_name_the_path(client, tools, param):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "tools": tools,
                                                  "messages": [{"role": "user", "content": "a"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert param in r.json()["error"]["message"] or param == "tools"


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": "always", "tools": [WEATHER]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "tools": [WEATHER]},
     "tool_choice.function.name"),
    ({"tool_choice": {"type": "function"}, "tools": [WEATHER]}, "tool_choice"),
    ({"parallel_tool_calls": "yes", "tools": [WEATHER]}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_tool_choices(client, extra, param):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                                                  **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "content": None}, "messages[1].content"),
    ({"role": "assistant", "content": None, "tool_calls": {}}, "messages[1].tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "user", "content": "a", "tool_calls": []}, "messages[1].tool_calls"),
    ({"role": "tool", "content": "18 C", "tool_call_id": 7}, "messages[1].tool_call_id"),
])
def test_bad_tool_messages(client, message, param):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "a"}, message, {"role": "user", "content": "b"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
