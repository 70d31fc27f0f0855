"""Reasoning split for Qwen3.6: the generated text before `</think>` is reasoning, the rest is content.

With thinking on, Qwen3.6's template ends the prompt with `<think>\\n`, so the model generates
`reasoning\\n</think>\\n\\nanswer`. Templates without that prefill let the model open with
`<think>` itself; a leading `<think>` is skipped. With thinking off the prompt already holds an
empty think block, and everything generated is content (the parser passes it through untouched).

Reasoning also ends at `<tool_call>` when `<function=` follows it (after optional whitespace): a
model may go straight from thinking into a call without `</think>`. A bare `<tool_call>` mentioned
in the reasoning text does not end it. vLLM's qwen3 reasoning parser draws the same line; older vLLM
and llama-server's XML parser keep a call made inside the think block as reasoning text, which
hides a call the model meant to make. Reasoning that never ends (max_tokens reached while thinking) is all reasoning.

Newlines: the newlines right inside the think block (after `<think>`, before `</think>` or the
implicit end) and those right after `</think>` are dropped; other whitespace is kept. This is the
inverse of the template, which renders `<think>\\n` + reasoning + `\\n</think>\\n\\n` + content and
splits history with `.lstrip('\\n')`/`.rstrip('\\n')`. vLLM keeps the text around the tags verbatim
(so its content begins "\\n\\n"); llama-server strips all surrounding whitespace.

Streaming holds back only what may still become a tag (a `</think>` prefix, a `<tool_call>`
waiting for its `<function=`) and a run of trailing newlines that the end tag would drop; the
concatenated deltas equal the one-shot split for every way of cutting the text.
"""
from __future__ import annotations

import re
from enum import Enum

from .scan import partial_suffix

THINK = "<think>"
THINK_END = "</think>"
TOOL_CALL = "<tool_call>"
_FUNCTION = "<function="
_IMPLICIT_END = re.compile(r"<tool_call>\s*<function=")
_END_TAGS = (THINK_END, TOOL_CALL)


class _Mode(Enum):
    OPENING = 1  # before the first reasoning text: newlines and one `<think>` are dropped
    REASONING = 2
    AFTER_END = 3  # just past `</think>`: newlines are dropped
    CONTENT = 4


class ReasoningParser:
    """Streaming split of one choice's text into (reasoning, content).

    feed(delta) -> (reasoning_delta, content_delta), either may be "";
    finish() -> the last (reasoning_delta, content_delta) at the end of generation.
    """

    def __init__(self, enabled: bool = True):
        self._mode = _Mode.OPENING if enabled else _Mode.CONTENT
        self._buf = ""
        self._held_newlines = 0
        self._leading = True  # newlines right after `<think>` are dropped

    @property
    def ended(self) -> bool:
        """Whether reasoning is over (or never began), so everything now is content."""
        return self._mode in (_Mode.AFTER_END, _Mode.CONTENT)

    def feed(self, text: str) -> tuple[str, str]:
        if self._mode is _Mode.CONTENT:
            return "", text
        self._buf += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        if self._mode is _Mode.CONTENT:
            return "", ""
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        progress = True
        while progress:
            progress = self._step(final, reasoning, content)
        return "".join(reasoning), "".join(content)

    def _step(self, final: bool, reasoning: list[str], content: list[str]) -> bool:
        buf = self._buf
        if self._mode is _Mode.OPENING:
            rest = buf.lstrip("\n")
            if rest.startswith(THINK):
                self._buf = rest[len(THINK):]
                self._mode = _Mode.REASONING
                return True
            if not final and (not rest or THINK.startswith(rest)):
                self._buf = rest
                return False
            self._buf = rest
            self._mode = _Mode.REASONING
            return True
        if self._mode is _Mode.REASONING:
            return self._reason(final, reasoning, content)
        if self._mode is _Mode.AFTER_END:
            rest = buf.lstrip("\n")
            self._buf = ""
            if rest:
                self._mode = _Mode.CONTENT
                content.append(rest)
            return False
        content.append(buf)
        self._buf = ""
        return False

    def _reason(self, final: bool, reasoning: list[str], content: list[str]) -> bool:
        buf = self._buf
        end = buf.find(THINK_END)
        implicit = _IMPLICIT_END.search(buf)
        if implicit is not None and (end < 0 or implicit.start() < end):
            self._emit(buf[:implicit.start()], reasoning)
            self._held_newlines = 0
            self._buf = ""
            self._mode = _Mode.CONTENT
            content.append(buf[implicit.start():])
            return False
        if end >= 0:
            self._emit(buf[:end], reasoning)
            self._held_newlines = 0
            self._buf = buf[end + len(THINK_END):]
            self._mode = _Mode.AFTER_END
            return True
        cut = len(buf) if final else _holdback(buf)
        self._emit(buf[:cut], reasoning)
        self._buf = buf[cut:]
        if final:
            self._held_newlines = 0
        return False

    def _emit(self, text: str, reasoning: list[str]) -> None:
        if self._leading:
            text = text.lstrip("\n")
        if not text:
            return
        self._leading = False
        joined = "\n" * self._held_newlines + text
        kept = joined.rstrip("\n")
        self._held_newlines = len(joined) - len(kept)
        if kept:
            reasoning.append(kept)


def _holdback(buf: str) -> int:
    """Where the part of `buf` that may still become an end tag begins."""
    i = buf.rfind(TOOL_CALL)
    if i >= 0:
        rest = buf[i + len(TOOL_CALL):].lstrip()
        if _FUNCTION.startswith(rest) and len(rest) < len(_FUNCTION):
            return i
    return len(buf) - partial_suffix(buf, _END_TAGS)


def split_reasoning(text: str, enabled: bool = True) -> tuple[str | None, str | None]:
    """The one-shot split: (reasoning_content, content), each None when empty."""
    parser = ReasoningParser(enabled)
    reasoning, content = parser.feed(text)
    last_reasoning, last_content = parser.finish()
    return (reasoning + last_reasoning) or None, (content + last_content) or None
