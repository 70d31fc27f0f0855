"""The parser the API runs per choice: reasoning split, then tool calls in the content channel.

    parser = ChatOutputParser(request.tools, reasoning=thinking_on)
    for text in detokenized_deltas:
        for delta in parser.feed(text):
            send(delta.as_openai())
    last, message = parser.finish()  # send `last` too; then finish_reason, and failures -> a metric

`ChatOutputParser.parse(text, ...)` is the non-streamed path; it runs the same machine over the
whole text, so its message is exactly what the streamed deltas add up to.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .message import Delta, ParsedMessage, assemble, merge
from .reasoning import ReasoningParser
from .tool_calls import ToolCallParser


class ChatOutputParser:
    """One choice's generated text -> reasoning, content and tool-call deltas, and the final message.

    tools: the request's OpenAI `tools` (None or [] turns tool parsing off);
    reasoning: whether the prompt left a think block open (thinking on);
    seed: makes the tool call ids reproducible.
    """

    def __init__(self, tools: Iterable[Any] | None = None, reasoning: bool = True, seed: int | None = None):
        self._reasoning = ReasoningParser(enabled=reasoning)
        self._calls = ToolCallParser(tools, seed=seed, after_think=reasoning)
        self._deltas: list[Delta] = []

    @property
    def failures(self) -> int:
        return self._calls.failures

    def feed(self, text: str) -> list[Delta]:
        """The deltas that `text` (the next piece of detokenized output) completes; often none."""
        reasoning, content = self._reasoning.feed(text)
        return self._keep(reasoning, self._calls.feed(content) if content else [])

    def finish(self) -> tuple[list[Delta], ParsedMessage]:
        """At the end of generation: the held-back deltas, and the whole message."""
        reasoning, content = self._reasoning.finish()
        last = self._keep(reasoning, self._calls.feed(content) + self._calls.finish())
        return last, assemble(self._deltas, self._calls.failures)

    def _keep(self, reasoning: str, deltas: list[Delta]) -> list[Delta]:
        out = merge(([Delta(reasoning_content=reasoning)] if reasoning else []) + deltas)
        self._deltas += out
        return out

    @classmethod
    def parse(cls, text: str, tools: Iterable[Any] | None = None, reasoning: bool = True,
              seed: int | None = None) -> ParsedMessage:
        """The non-streamed parse of a whole generation."""
        parser = cls(tools, reasoning, seed)
        parser.feed(text)
        return parser.finish()[1]
