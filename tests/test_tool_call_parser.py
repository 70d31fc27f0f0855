"""Tool calls and the combined parser: the rules of services/router/frontend/chat/tool_calls.py and
arguments.py, and the transcripts in tests/data/transcripts/qwen3_6.json streamed at every cut.

Each transcript is fed (a) one character at a time, (b) cut in two at every character and at every
UTF-8 byte (through an incremental decoder, as a detokenizer emits whole characters), and (c) in
seeded random chunks. The streamed deltas must add up to the one-shot parse, which must equal the
message written out in the transcript.
"""
from __future__ import annotations

import codecs
import json
import random
import re
from pathlib import Path

import pytest

from services.router.frontend.chat import (
    ChatOutputParser,
    Delta,
    ParsedMessage,
    ToolCallDelta,
    ToolCallParser,
    assemble,
)
from services.router.frontend.chat.arguments import convert_value

TRANSCRIPTS = json.loads((Path(__file__).parent / "data" / "transcripts" / "qwen3_6.json").read_text("utf-8"))
TOOLSETS = TRANSCRIPTS["tools"]
CASES = TRANSCRIPTS["transcripts"]
SEED = 7
RANDOM_RUNS = 20  # seeded random chunkings per transcript
CALL_ID = re.compile(r"call_[0-9a-f]{24}")

WEATHER = TOOLSETS["weather"]
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def tools_of(case: dict) -> list | None:
    return TOOLSETS[case["tools"]] if case["tools"] else None


def stream(pieces: list[str], tools: list | None, reasoning: bool) -> tuple[list[Delta], ParsedMessage]:
    parser = ChatOutputParser(tools, reasoning, seed=SEED)
    deltas = [delta for piece in pieces for delta in parser.feed(piece)]
    last, message = parser.finish()
    return deltas + last, message


def as_expected(message: ParsedMessage) -> dict:
    return {"reasoning_content": message.reasoning_content, "content": message.content,
            "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls],
            "failures": message.failures, "finish_reason": message.finish_reason_override}


def byte_cuts(text: str) -> list[list[str]]:
    data = text.encode("utf-8")
    cuts = []
    for i in range(len(data) + 1):
        decoder = codecs.getincrementaldecoder("utf-8")()
        cuts.append([decoder.decode(data[:i]), decoder.decode(data[i:], final=True)])
    return cuts


def random_chunks(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 12)
        pieces.append(text[i:i + n])
        i += n
    return pieces


def test_there_are_enough_transcripts_and_each_failure_case_is_one():
    names = {case["name"] for case in CASES}
    assert len(CASES) >= 30 and len(names) == len(CASES)
    for needed in ("fail_text_before_tool_call_without_newlines", "fail_duplicated_close_parameter",
                   "fail_trailing_think_after_call", "fail_answer_ends_in_think", "fail_tool_call_inside_think",
                   "fail_unclosed_tool_call_max_tokens", "fail_unknown_function", "fail_parameter_missing_close",
                   "fail_invalid_integer"):
        assert needed in names


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_transcript_parses_to_its_message(case):
    message = ChatOutputParser.parse(case["text"], tools_of(case), case["reasoning"], seed=SEED)
    assert as_expected(message) == case["expected"]
    for call, want in zip(message.tool_calls, case["expected"]["tool_calls"]):
        assert call.arguments == json.dumps(want["arguments"], ensure_ascii=False)
        assert CALL_ID.fullmatch(call.id)
    assert len({call.id for call in message.tool_calls}) == len(message.tool_calls)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_transcript_streamed_any_way_equals_the_one_shot_parse(case):
    text, tools, reasoning = case["text"], tools_of(case), case["reasoning"]
    whole = ChatOutputParser.parse(text, tools, reasoning, seed=SEED)
    rng = random.Random(SEED)
    cuts = [list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)] + byte_cuts(text)
    cuts += [random_chunks(text, rng) for _ in range(RANDOM_RUNS)]
    for pieces in cuts:
        deltas, message = stream(pieces, tools, reasoning)
        assert message == whole, pieces
        assert assemble(deltas, message.failures) == whole, pieces


# ---- streaming shape ----

def test_a_call_streams_its_name_first_then_arguments_as_parameters_complete():
    parser = ToolCallParser(WEATHER, seed=1)
    assert parser.feed("<tool_call>\n<function=get_wea") == []
    (head,) = parser.feed("ther>\n<parameter=city>\nPar")
    assert head.as_openai() == {"tool_calls": [{"index": 0, "id": head.tool_call.id, "type": "function",
                                                "function": {"name": "get_weather", "arguments": ""}}]}
    assert parser.feed("is\n</parameter>\n<parameter=days>\n") == [
        Delta(tool_call=ToolCallDelta(index=0, arguments='{"city": "Paris"'))]
    assert [d.as_openai() for d in parser.feed("2\n</parameter>\n</function>\n</tool_call>")] == [
        {"tool_calls": [{"index": 0, "function": {"arguments": ', "days": 2'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}]
    assert parser.finish() == [] and parser.failures == 0 and parser.calls == 1


def test_content_is_held_back_only_where_a_tag_may_begin():
    parser = ToolCallParser(WEATHER)
    assert parser.feed("3 < 4, and <tool") == [Delta(content="3 < 4, and ")]
    assert parser.feed("box>") == [Delta(content="<toolbox>")]
    assert parser.feed("\n\n") == []  # dropped if a call follows
    assert parser.feed("ok") == [Delta(content="\n\nok")]
    assert parser.finish() == []


def test_ids_are_reproducible_with_a_seed_and_distinct_without():
    text = CALL + "\n" + CALL
    assert ChatOutputParser.parse(text, WEATHER, False, seed=3) == ChatOutputParser.parse(text, WEATHER, False, seed=3)
    ids = [c.id for c in ChatOutputParser.parse(text, WEATHER, False).tool_calls]
    assert len(set(ids)) == 2 and all(CALL_ID.fullmatch(i) for i in ids)


def test_the_message_in_openai_shape():
    message = ChatOutputParser.parse("Hmm.\n</think>\n\n" + CALL, WEATHER, seed=0)
    body = message.as_openai()
    assert body == {"role": "assistant", "content": None, "reasoning_content": "Hmm.",
                    "tool_calls": [{"id": message.tool_calls[0].id, "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert message.finish_reason_override == "tool_calls"
    assert ChatOutputParser.parse("Hi", WEATHER, False).as_openai() == {"role": "assistant", "content": "Hi"}
    assert ChatOutputParser.parse("Hi", WEATHER, False).finish_reason_override is None


def test_no_tools_means_no_calls():
    for tools in (None, []):
        message = ChatOutputParser.parse(CALL, tools, reasoning=False)
        assert message.content == CALL and not message.tool_calls and message.failures == 0


def test_odd_tool_definitions_are_skipped_not_fatal():
    tools = [{"type": "function"}, "junk", {"function": {"name": 3}}, {"function": {"name": "ping", "parameters": []}}]
    message = ChatOutputParser.parse("<tool_call>\n<function=ping>\n<parameter=n>\n1\n</parameter>\n</function>\n"
                                     "</tool_call>", tools, reasoning=False)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("ping", '{"n": 1}')]


def test_a_think_at_the_start_of_the_content_is_out_of_place_after_reasoning():
    text = "<think>\nagain\n</think>\n\nHi"
    for after_think, failures in ((False, 0), (True, 1)):
        parser = ToolCallParser(None, after_think=after_think)
        deltas = parser.feed(text) + parser.finish()
        assert assemble(deltas, parser.failures) == ParsedMessage("again", "Hi", (), failures)


# ---- failure rules, one at a time ----

FAILURES = [
    # (content channel, content, [(name, arguments)], failures)
    ("Text first." + CALL, "Text first.", [("get_weather", '{"city": "Paris"}')], 0),
    (CALL.replace("</parameter>", "</parameter>\n</parameter>"), None, [("get_weather", '{"city": "Paris"}')], 1),
    (CALL.replace("</function>", "</function>\n</function>"), None, [("get_weather", '{"city": "Paris"}')], 1),
    (CALL + "\n<think>\n", None, [("get_weather", '{"city": "Paris"}')], 1),
    (CALL + "<think>still thinking", None, [("get_weather", '{"city": "Paris"}')], 1),
    (CALL + "\n</think>\n\n", None, [("get_weather", '{"city": "Paris"}')], 1),
    ("Answer.<think>", "Answer.", [], 1),
    (CALL[:55], None, [("get_weather", '{"city": "Par"}')], 1),
    (CALL[:50], None, [("get_weather", "{}")], 1),
    (CALL[:40], None, [("get_weather", "{}")], 1),
    (CALL.replace("get_weather", "get_time"), CALL.replace("get_weather", "get_time"), [], 1),
    (CALL.replace("\n</parameter>", ""), None, [("get_weather", '{"city": "Paris"}')], 1),
    (CALL.replace("Paris", "Paris\n</parameter>\n<parameter=days>\nsoon"), None,
     [("get_weather", '{"city": "Paris", "days": "soon"}')], 1),
    (CALL.replace("</parameter>", "</parameter>\n<parameter=city>\nRome\n</parameter>"), None,
     [("get_weather", '{"city": "Paris"}')], 1),
    (CALL.replace("</function>\n", ""), None, [("get_weather", '{"city": "Paris"}')], 1),
    ("<tool_call>\nnot a call\n</tool_call> then text", "<tool_call>\nnot a call\n</tool_call> then text", [], 1),
    (CALL + " trailing", "trailing", [("get_weather", '{"city": "Paris"}')], 1),
    ("Before.\n" + CALL + "\nAfter.", "Before.\n\nAfter.", [("get_weather", '{"city": "Paris"}')], 1),
    ("<think>\nthought\n</think>\n\n" + CALL, None, [("get_weather", '{"city": "Paris"}')], 0),
]


@pytest.mark.parametrize("text,content,calls,failures", FAILURES)
def test_fail_soft(text, content, calls, failures):
    message = ChatOutputParser.parse(text, WEATHER, reasoning=False)
    assert (message.content, [(c.name, c.arguments) for c in message.tool_calls], message.failures) == (
        content, calls, failures)
    for pieces in [list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)]:
        assert stream(pieces, WEATHER, False)[1] == ChatOutputParser.parse(text, WEATHER, False, seed=SEED)


def test_a_think_block_outside_a_call_is_reasoning():
    message = ChatOutputParser.parse("Answer.\n\n<think>\nsecond thoughts\n</think>\n\nMore.", None, reasoning=False)
    assert (message.reasoning_content, message.content, message.failures) == ("second thoughts", "Answer.\n\nMore.", 1)


def test_random_tag_soup_never_raises_and_streams_alike():
    rng = random.Random(SEED)
    alphabet = ["<tool_call>", "</tool_call>", "<function=get_weather>", "<function=", "</function>", "<parameter=",
                "city>", "days>", "</parameter>", "<think>", "</think>", "\n", " ", "<", ">", "x", "3", "é"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        reasoning = rng.random() < 0.5
        whole = ChatOutputParser.parse(text, WEATHER, reasoning, seed=SEED)
        for call in whole.tool_calls:
            assert isinstance(json.loads(call.arguments), dict)
        assert stream(random_chunks(text, rng), WEATHER, reasoning)[1] == whole, text


# ---- argument types ----

@pytest.mark.parametrize("raw,schema,value,ok", [
    ("  keep  me ", {"type": "string"}, "  keep  me ", True),
    ("null", {"type": "string"}, "null", True),
    ("42", {"type": "integer"}, 42, True),
    (" -7\n", {"type": "integer"}, -7, True),
    ("4.0", {"type": "integer"}, 4, True),
    ("4.5", {"type": "integer"}, "4.5", False),
    ("true", {"type": "integer"}, "true", False),
    ("0x10", {"type": "integer"}, "0x10", False),
    ("3", {"type": "number"}, 3, True),
    ("2.5e3", {"type": "number"}, 2500.0, True),
    ("NaN", {"type": "number"}, "NaN", False),
    ("TRUE", {"type": "boolean"}, True, True),
    ("no", {"type": "boolean"}, "no", False),
    ('{"a": [1, {"b": null}]}', {"type": "object"}, {"a": [1, {"b": None}]}, True),
    ("{'a': False}", {"type": "object"}, {"a": False}, True),
    ("[1, 2]", {"type": "object"}, "[1, 2]", False),
    ("(1, 'two')", {"type": "array"}, [1, "two"], True),
    ("{1, 2}", {"type": "array"}, "{1, 2}", False),
    ("null", {"type": "null"}, None, True),
    ("nil", {"type": "null"}, "nil", False),
    ("null", {"type": ["integer", "null"]}, None, True),
    ("8", {"type": ["integer", "null"]}, 8, True),
    ("8", {"type": ["string", "integer"]}, 8, True),
    ("eight", {"type": ["string", "integer"]}, "eight", True),
    ("1", {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}, 1, True),
    ("[1]", None, [1], True),
    ("plain words", {}, "plain words", True),
    ("5", {"type": "weird"}, 5, True),
    ("[" * 5000, {"type": "array"}, "[" * 5000, False),
])
def test_convert_value(raw, schema, value, ok):
    assert convert_value(raw, schema) == (value, ok)
