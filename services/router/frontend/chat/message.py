"""What the chat output parsers hand to the API: stream deltas, and the whole message they add up to.

A `Delta` carries exactly one thing: a piece of reasoning, a piece of content, or one fragment of
one tool call. `assemble` folds a list of deltas into the `ParsedMessage`, so the message of a
non-streamed request is, by construction, what its streamed deltas concatenate to.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCallDelta:
    """One fragment of tool call `index`: the first has `id` and `name` (and arguments ""),
    the later ones only a piece of the arguments JSON."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict[str, Any]:
        """The entry of `choices[].delta.tool_calls` for this fragment."""
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Delta:
    """A stream event: exactly one of the three fields is set."""

    reasoning_content: str | None = None
    content: str | None = None
    tool_call: ToolCallDelta | None = None

    def as_openai(self) -> dict[str, Any]:
        """The `choices[].delta` body for this event (without `role`)."""
        if self.tool_call is not None:
            return {"tool_calls": [self.tool_call.as_openai()]}
        if self.reasoning_content is not None:
            return {"reasoning_content": self.reasoning_content}
        return {"content": self.content}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedMessage:
    """The assistant message of one choice. Empty text fields are None, as OpenAI sends them.

    `failures` counts the malformed spots the parsers met and softened (for a metric); it says
    nothing about whether the message is usable.
    """

    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)
    failures: int = 0

    @property
    def finish_reason_override(self) -> str | None:
        """"tool_calls" when at least one call parsed, else None (keep the engine's reason)."""
        return "tool_calls" if self.tool_calls else None

    def as_openai(self) -> dict[str, Any]:
        """The `choices[].message` body."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [call.as_openai() for call in self.tool_calls]
        return message


def assemble(deltas: Iterable[Delta], failures: int = 0) -> ParsedMessage:
    """The message that `deltas` add up to."""
    reasoning: list[str] = []
    content: list[str] = []
    heads: dict[int, ToolCallDelta] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.reasoning_content is not None:
            reasoning.append(delta.reasoning_content)
        elif delta.content is not None:
            content.append(delta.content)
        elif delta.tool_call is not None:
            fragment = delta.tool_call
            if fragment.name is not None:
                heads.setdefault(fragment.index, fragment)
            arguments.setdefault(fragment.index, []).append(fragment.arguments)
    calls = tuple(ToolCall(id=heads[i].id or "", name=heads[i].name or "", arguments="".join(arguments[i]))
                  for i in sorted(heads))
    return ParsedMessage(reasoning_content="".join(reasoning) or None, content="".join(content) or None,
                         tool_calls=calls, failures=failures)


def merge(deltas: list[Delta]) -> list[Delta]:
    """Adjacent reasoning or content pieces joined, so one feed yields few events."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is not None and delta.reasoning_content is not None and last.reasoning_content is not None:
            out[-1] = Delta(reasoning_content=last.reasoning_content + delta.reasoning_content)
        elif last is not None and delta.content is not None and last.content is not None:
            out[-1] = Delta(content=last.content + delta.content)
        else:
            out.append(delta)
    return out
