"""Reasoning split: the rules of services/router/frontend/chat/reasoning.py, one-shot and streamed at every cut.

The text is what Qwen3.6 generates after a prompt that ends `<think>\\n` (thinking on) or an empty
think block (thinking off). The streamed pieces must join to the one-shot split, whatever the cut.
"""
from __future__ import annotations

import pytest

from services.router.frontend.chat.reasoning import ReasoningParser, split_reasoning


def streamed(text: str, pieces: list[str], enabled: bool = True) -> tuple[str, str, list[tuple[str, str]]]:
    parser = ReasoningParser(enabled)
    outs = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    return "".join(r for r, _ in outs), "".join(c for _, c in outs), outs


def every_cut(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


CASES = [
    # (text, thinking on, reasoning_content, content)
    ("The user says hi.\n</think>\n\nHello!", True, "The user says hi.", "Hello!"),
    ("\nStarts with a blank.\n\n</think>\n\n\nAnswer\n", True, "Starts with a blank.", "Answer\n"),
    ("<think>\nI opened it myself.\n</think>\n\nDone.", True, "I opened it myself.", "Done."),
    ("\n<think>\nAfter a newline.\n</think>Tight.", True, "After a newline.", "Tight."),
    ("Para one.\n\nPara two.\n</think>\n\nx", True, "Para one.\n\nPara two.", "x"),
    ("Spaces stay.  \n</think>\n\n  indented", True, "Spaces stay.  ", "  indented"),
    ("\n</think>\n\nNo reasoning.", True, None, "No reasoning."),
    ("</think>", True, None, None),
    ("Cut off by max_tokens while thin", True, "Cut off by max_tokens while thin", None),
    ("Cut off right at the tag\n</thi", True, "Cut off right at the tag\n</thi", None),
    ("Go.\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>", True, "Go.",
     "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    ("Go.<tool_call><function=f>", True, "Go.", "<tool_call><function=f>"),
    ("Mentions <tool_call> in passing.\n</think>\n\nOk.", True, "Mentions <tool_call> in passing.", "Ok."),
    ("Mentions <tool_call>\nthen words\n</think>\n\nOk.", True, "Mentions <tool_call>\nthen words", "Ok."),
    ("A <tool_call> <func mention.\n</think>\n\nOk.", True, "A <tool_call> <func mention.", "Ok."),
    ("Ends at <tool_call>\n<function", True, "Ends at <tool_call>\n<function", None),
    ("Two ends.\n</think>\n\nAnswer </think> kept.", True, "Two ends.", "Answer </think> kept."),
    ("A <think> inside reasoning is text.\n</think>\n\nok", True, "A <think> inside reasoning is text.", "ok"),
    ("Unicode é 🌧 東京\n</think>\n\nRéponse ☀️", True, "Unicode é 🌧 東京", "Réponse ☀️"),
    ("Thinking off: </think> and <think> are content.", False, None, "Thinking off: </think> and <think> are content."),
    ("\n\nverbatim\n", False, None, "\n\nverbatim\n"),
    ("", True, None, None),
    ("", False, None, None),
]


@pytest.mark.parametrize("text,enabled,reasoning,content", CASES)
def test_the_split(text, enabled, reasoning, content):
    assert split_reasoning(text, enabled) == (reasoning, content)


@pytest.mark.parametrize("text,enabled,reasoning,content", CASES)
def test_streaming_at_every_cut_and_char_by_char_equals_the_split(text, enabled, reasoning, content):
    expected = (reasoning or "", content or "")
    for pieces in every_cut(text) + [list(text)]:
        assert streamed(text, pieces, enabled)[:2] == expected, pieces


def test_only_a_possible_tag_is_held_back():
    parser = ReasoningParser()
    assert parser.feed("Weighing 3 < 4 and a </thi") == ("Weighing 3 < 4 and a ", "")
    assert parser.feed("ng> that is no tag") == ("</thing> that is no tag", "")
    assert parser.feed(" <tool_call>\n ") == (" ", "")  # may still be followed by <function=
    assert parser.feed("see?") == ("<tool_call>\n see?", "")
    assert parser.feed("\n\n") == ("", "")  # dropped if </think> follows
    assert parser.feed("more") == ("\n\nmore", "")
    assert parser.feed("\n</think>") == ("", "")
    assert parser.ended
    assert parser.feed("\n\n") == ("", "")
    assert parser.feed("Answer\n") == ("", "Answer\n")
    assert parser.finish() == ("", "")


def test_a_leading_think_prefix_is_held_until_it_resolves():
    parser = ReasoningParser()
    assert parser.feed("<thi") == ("", "")
    assert parser.feed("nk>\nreal") == ("real", "")
    other = ReasoningParser()
    assert other.feed("<th") == ("", "")
    assert other.feed("ird") == ("<third", "")


def test_implicit_end_hands_the_tool_call_to_the_content_channel():
    parser = ReasoningParser()
    assert parser.feed("Calling.\n<tool_call>") == ("Calling.", "")
    assert parser.feed("\n<function=") == ("", "<tool_call>\n<function=")
    assert parser.ended
    assert parser.feed("get_weather>") == ("", "get_weather>")


def test_thinking_off_passes_everything_through_at_once():
    parser = ReasoningParser(enabled=False)
    assert parser.ended
    assert parser.feed("<think>") == ("", "<think>")
    assert parser.feed("\n") == ("", "\n")
    assert parser.finish() == ("", "")


def test_byte_cuts_through_an_incremental_utf8_decoder():
    """A detokenizer emits whole characters; cutting the bytes anywhere and decoding incrementally
    gives the character cuts, multi-byte characters included."""
    import codecs

    text = "Ré 🌧 </th東ink>\n</think>\n\n☀️ fin"
    expected = ("Ré 🌧 </th東ink>", "☀️ fin")
    data = text.encode("utf-8")
    for i in range(len(data) + 1):
        decoder = codecs.getincrementaldecoder("utf-8")()
        pieces = [decoder.decode(data[:i]), decoder.decode(data[i:], final=True)]
        assert streamed(text, pieces)[:2] == expected, i
