"""An agent loop through the chat API (issue #30): the conversation a client sends back (assistant
tool calls with null content, tool results, the developer role, earlier reasoning) rendered as the
Qwen3.6 template and transformers render it; the official openai client against a real router."""
from __future__ import annotations

import contextlib
import copy
import json

import openai
import pytest

from common.model.chat_template import BUNDLED_TEMPLATE, render_chat
from tests.agent_helpers import (
    GEN_THINK,
    MODEL,
    PARIS_ARGS,
    TIME,
    WEATHER,
    ScriptedDispatcher,
    agent_client,
    call_text,
    make_api,
    post,
)
from tests.http_helpers import serve_app
from tests.test_api_errors import lifespan

ROUND = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "reasoning_content": "Two cities, two calls.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": PARIS_ARGS}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "-2 C"}]},
]


def as_template_sees_it(messages: list[dict]) -> list[dict]:
    """The same conversation as transformers takes it: system for developer, arguments as objects,
    text parts joined."""
    out = copy.deepcopy(messages)
    for m in out:
        m["role"] = "system" if m["role"] == "developer" else m["role"]
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def test_the_tool_round_is_rendered_as_the_template_says():
    with agent_client() as client:
        post(client, "ok", messages=ROUND, tools=[WEATHER])
        prompt = client.dispatcher.prompt()
    assert prompt == render_chat(as_template_sees_it(ROUND), tools=[WEATHER])
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and "\n\nBe brief.<|im_end|>\n" in prompt
    assert ("<|im_start|>assistant\n<think>\nTwo cities, two calls.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n-2 C\n"
            "</tool_response><|im_end|>\n" + GEN_THINK) in prompt
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    theirs = utils.render_jinja_template([as_template_sees_it(ROUND)], tools=[WEATHER], add_generation_prompt=True,
                                         chat_template=BUNDLED_TEMPLATE.read_text(encoding="utf-8"))
    assert prompt == (theirs[0][0] if isinstance(theirs, tuple) else theirs)


EARLIER = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
           {"role": "user", "content": "Q2"}]


@pytest.mark.parametrize("preserve", [False, True])
def test_earlier_reasoning_follows_preserve_thinking(preserve):
    with agent_client(preserve_thinking=preserve) as client:
        post(client, "ok", messages=EARLIER)
        kept = "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>" in client.dispatcher.prompt()
        assert kept == preserve
        post(client, "ok", messages=EARLIER, chat_template_kwargs={"preserve_thinking": not preserve})
        assert ("<think>\nR1\n</think>" in client.dispatcher.prompt()) == (not preserve), "a request's own wins"


def test_a_template_without_the_switch_gets_the_reasoning_in_content():
    plain = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
             "<|im_start|>assistant\n")
    with agent_client(preserve_thinking=True, template=plain) as client:
        post(client, "ok", messages=EARLIER)
        assert "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>" in client.dispatcher.prompt()


# ---- the official client over HTTP
@contextlib.contextmanager
def router(dispatcher: ScriptedDispatcher):
    with serve_app(make_api(dispatcher).app(lifespan=lifespan(dispatcher))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_the_openai_client_reads_calls_and_reasoning():
    dispatcher = ScriptedDispatcher()
    dispatcher.script = ("Both cities.\n</think>\n\n" + call_text("get_weather", city="Paris", days=3) + "\n"
                         + call_text("get_time"))
    messages = [{"role": "user", "content": "Weather in Paris, and the time?"}]
    with router(dispatcher) as client:
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME])
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and message.content is None
        assert message.model_extra["reasoning_content"] == "Both cities."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == \
            [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
        calls: dict[int, dict] = {}
        reasoning, finish = "", None
        for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME],
                                                    stream=True):
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for frag in delta.tool_calls or []:
                call = calls.setdefault(frag.index, {"id": frag.id, "name": frag.function.name, "arguments": ""})
                call["arguments"] += frag.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert reasoning == "Both cities." and finish == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
            [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
        assert len({c["id"] for c in calls.values()}) == 2 and all(c["id"].startswith("call_") for c in calls.values())
        # the next turn, sent back as the client builds it
        dispatcher.script = "Mild.\n</think>\n\nParis is 18 C."
        follow = messages + [message.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": "18 C"} for c in message.tool_calls]
        r = client.chat.completions.create(model=MODEL, messages=follow, tools=[WEATHER, TIME])
        assert r.choices[0].message.content == "Paris is 18 C." and r.choices[0].finish_reason == "stop"
        assert "<tool_response>\n18 C\n</tool_response>" in dispatcher.prompt()
