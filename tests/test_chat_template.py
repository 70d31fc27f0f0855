"""Chat template: renderings checked against strings written out from Qwen3.6's template rules.

The rules, in short: ChatML turns `<|im_start|>{role}\\n{content}<|im_end|>\\n` with trimmed
content; tools go first in the system turn; assistant turns after the last real user query
carry `<think>\\n{reasoning}\\n</think>\\n\\n`, earlier ones lose their reasoning; tool calls are
XML `<tool_call><function=...><parameter=...>` blocks; consecutive tool results share one user
turn of `<tool_response>` blocks; the generation prompt opens `<think>\\n`, or an empty think
block when thinking is off.
"""
from __future__ import annotations

import json

import pytest

from common.model.chat_template import (
    BUNDLED_TEMPLATE,
    ChatTemplateError,
    render_chat,
    template_from_checkpoint,
    template_from_gguf,
)
from tests.conftest import Metadata

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
GEN_THINK = "<|im_start|>assistant\n<think>\n"
GEN_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_TOOL_JSON = ('{"type": "function", "function": {"name": "get_weather", "description": '
                     '"Weather for a city, in °C", "parameters": {"type": "object", "properties": '
                     '{"city": {"type": "string"}}, "required": ["city"]}}}')
TOOLS_SYSTEM = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    + WEATHER_TOOL_JSON + "\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block "
    "must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>")


def sys_user(text="Hi!"):
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": text}]


# ---- turns and thinking
def test_system_and_user_with_thinking():
    assert render_chat(sys_user()) == SYSTEM + "<|im_start|>user\nHi!<|im_end|>\n" + GEN_THINK


def test_thinking_off_opens_an_empty_think_block():
    assert render_chat(sys_user(), enable_thinking=False) == \
        SYSTEM + "<|im_start|>user\nHi!<|im_end|>\n" + GEN_NO_THINK


def test_no_generation_prompt_and_trimmed_content():
    assert render_chat([{"role": "user", "content": "  Hi!\n\n"}], add_generation_prompt=False) == \
        "<|im_start|>user\nHi!<|im_end|>\n"


def test_content_as_text_parts():
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert render_chat([{"role": "user", "content": parts}]) == \
        "<|im_start|>user\nHello there<|im_end|>\n" + GEN_THINK


def test_earlier_reasoning_is_dropped():
    messages = sys_user("Q1") + [
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
        {"role": "user", "content": "Q3"},
    ]
    assert render_chat(messages) == (
        SYSTEM + "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\nA2<|im_end|>\n"
        "<|im_start|>user\nQ3<|im_end|>\n" + GEN_THINK)


def test_reasoning_after_the_last_query_is_kept():
    messages = sys_user("Q1") + [{"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"}]
    assert render_chat(messages, add_generation_prompt=False) == (
        SYSTEM + "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n")


def test_preserve_thinking_keeps_earlier_reasoning():
    messages = sys_user("Q1") + [
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
    ]
    rendered = render_chat(messages, template_kwargs={"preserve_thinking": True})
    assert "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n" in rendered


# ---- tools
def test_tool_definitions_go_in_the_system_turn():
    assert render_chat(sys_user(), tools=[WEATHER_TOOL]) == (
        TOOLS_SYSTEM + "\n\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n" + GEN_THINK)


def test_tools_without_a_system_message():
    assert render_chat([{"role": "user", "content": "Hi!"}], tools=[WEATHER_TOOL]) == (
        TOOLS_SYSTEM + "<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n" + GEN_THINK)


def _tool_round(arguments):
    return sys_user("Weather in Paris?") + [
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 18}'},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]


TOOL_ROUND = (
    SYSTEM + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\nLet me check.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=opts>\n{\"hourly\": [1, 2]}\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"temp\": 18}\n</tool_response>"
    "\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" + GEN_THINK)


def test_tool_call_and_tool_responses():
    args = {"city": "Paris", "days": 2, "metric": True, "opts": {"hourly": [1, 2]}}
    assert render_chat(_tool_round(args)) == TOOL_ROUND


def test_tool_call_arguments_as_a_json_string():
    args = '{"city": "Paris", "days": 2, "metric": true, "opts": {"hourly": [1, 2]}}'
    messages = _tool_round(args)
    assert render_chat(messages) == TOOL_ROUND
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == args, "caller's messages untouched"


def test_tool_call_without_content_and_later_answer():
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                        {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "cold"},
        {"role": "tool", "content": "warm"},
        {"role": "assistant", "content": "Oslo is cold, Rome is warm."},
        {"role": "user", "content": "Thanks"},
    ]
    assert render_chat(messages, enable_thinking=False) == (
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nOslo is cold, Rome is warm.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n" + GEN_NO_THINK)


# ---- where the template comes from


def test_embedded_template_is_preferred():
    custom = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    assert template_from_gguf(Metadata(**{"tokenizer.chat_template": custom})) == custom
    assert render_chat(sys_user(), template=custom) == "[system:You are a helpful assistant.][user:Hi!]"
    assert template_from_gguf(Metadata()) == BUNDLED_TEMPLATE.read_text(encoding="utf-8")


def test_checkpoint_template(tmp_path):
    assert template_from_checkpoint(tmp_path) == BUNDLED_TEMPLATE.read_text(encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "A"}))
    assert template_from_checkpoint(tmp_path) == "A"
    (tmp_path / "chat_template.jinja").write_text("B")
    assert template_from_checkpoint(tmp_path) == "B"


# ---- bad input
@pytest.mark.parametrize("messages, match", [
    ("Hi!", "must be a list"),
    ({"role": "user", "content": "Hi!"}, "must be a list"),
    ([], "empty"),
    (["Hi!"], "message 0 must be a dict"),
    ([{"role": "bot", "content": "Hi!"}], "role 'bot'; expected one of system, user, assistant, tool"),
    ([{"content": "Hi!"}], "role None"),
    ([{"role": "user"}], r"message 0 \(user\) has no content"),
    ([{"role": "user", "content": {"text": "x"}}], "content must be a string or a list"),
    ([{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}],
     "System message must be at the beginning"),
    ([{"role": "assistant", "content": "orphan"}], "No user query found"),
    ([{"role": "user", "content": [{"type": "audio"}]}], "Unexpected item type"),
    ([{"role": "user", "content": "x"}, {"role": "user", "content": "y", "tool_calls": [{}]}],
     "only assistant messages"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
     "not valid JSON"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
     "function.name"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
     "must be a JSON object"),
])
def test_bad_messages_raise_value_error(messages, match):
    with pytest.raises(ValueError, match=match):
        render_chat(messages)


def test_bad_tools_and_bad_template():
    with pytest.raises(ChatTemplateError, match="tools must be a list"):
        render_chat(sys_user(), tools={"name": "x"})
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat(sys_user(), template="{% if %}")


# ---- the same text as transformers' renderer, on the conversations above
@pytest.mark.parametrize("messages, tools, thinking", [
    (sys_user(), None, True),
    (sys_user(), [WEATHER_TOOL], False),
    (_tool_round({"city": "Paris", "days": 2, "metric": True, "opts": {"hourly": [1, 2]}}), [WEATHER_TOOL], True),
])
def test_matches_transformers_renderer(messages, tools, thinking):
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    theirs = utils.render_jinja_template([messages], tools=tools, add_generation_prompt=True,
                                         chat_template=BUNDLED_TEMPLATE.read_text(encoding="utf-8"),
                                         enable_thinking=thinking)
    theirs = theirs[0][0] if isinstance(theirs, tuple) else theirs
    assert render_chat(messages, tools=tools, enable_thinking=thinking) == theirs


AGENT_LOOP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    {"role": "assistant", "content": None, "reasoning_content": "Two calls.",
     "tool_calls": [{"id": c, "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                    for c, city in (("a", "Oslo"), ("b", "Rome"))]},
    {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": "cold"},
    {"role": "tool", "tool_call_id": "b", "name": "get_weather", "content": "warm"},
    {"role": "assistant", "content": "Oslo is cold, Rome warm.", "reasoning_content": "Both back."},
    {"role": "user", "content": "And Paris?"},
]


@pytest.mark.parametrize("kwargs", [{}, {"preserve_thinking": True}, {"enable_thinking": False}])
def test_agent_loop_matches_transformers(kwargs):
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    theirs = utils.render_jinja_template([AGENT_LOOP], tools=[WEATHER_TOOL], add_generation_prompt=True,
                                         chat_template=BUNDLED_TEMPLATE.read_text(encoding="utf-8"), **kwargs)
    theirs = theirs[0][0] if isinstance(theirs, tuple) else theirs
    extra = dict(kwargs)
    ours = render_chat(AGENT_LOOP, tools=[WEATHER_TOOL], enable_thinking=extra.pop("enable_thinking", True),
                       template_kwargs=extra)
    assert ours == theirs
    assert ("<think>\nTwo calls.\n</think>" in ours) == bool(kwargs.get("preserve_thinking"))


def test_reasoning_folds_into_content_for_a_template_without_the_switch():
    plain = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": " R\n"}]
    assert render_chat(messages, template=plain) == "[user:Q][assistant:A]"
    assert render_chat(messages, template=plain, template_kwargs={"preserve_thinking": True}) == \
        "[user:Q][assistant:<think>\nR\n</think>\n\nA]"
    assert messages[1]["content"] == "A", "caller's messages untouched"


def test_a_template_that_adds_a_null_content_is_a_value_error():
    chatml = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}{% endfor %}"
    calls = [{"role": "user", "content": "x"},
             {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]
    with pytest.raises(ValueError, match="the chat template failed"):
        render_chat(calls, template=chatml)
