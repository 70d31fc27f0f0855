"""Replies of the Anthropic Messages API: one chat choice's parser deltas (replies.ChatReply) as
content blocks, `thinking`, `text` and `tool_use`, whole or as Anthropic's stream events.

Blocks open in the order the deltas come. A change of kind, or the header of the next tool call,
closes the open block and opens a new one, so the streamed blocks add up to the whole message's.
A tool call's argument fragments are sent as `input_json_delta` pieces of its `input`. Thinking
blocks carry an empty `signature`: there is nothing to sign them with.

stop_reason: "max_tokens" when the token limit cut the answer (even inside a call, as Anthropic
does), "model_context_window_exceeded" when the context did, "stop_sequence" when one of
`stop_sequences` matched, "tool_use" when a call parsed, else "end_turn". Usage counts the prompt
tokens the prefix cache served as `cache_read_input_tokens` and the rest as `input_tokens`, whose
sum is the prompt, as Anthropic counts them.

A stream is: message_start, ping, per block content_block_start, its deltas and
content_block_stop, then message_delta (stop_reason, usage) and message_stop.
"""
from __future__ import annotations

import json
from typing import Any

from common.metrics import RouterMetrics

from ..engine import Delta as Run
from .chat import Delta
from .replies import ChatReply
from .schema import Job

KINDS = {"thinking": "thinking_delta", "text": "text_delta"}


def tool_use_id(call_id: str | None) -> str:
    """The parser's `call_...` id in Anthropic's `toolu_...` form."""
    return "toolu_" + (call_id or "").removeprefix("call_")


def usage(prompt: int, cached: int, output: int) -> dict[str, int]:
    return {"input_tokens": prompt - cached, "output_tokens": output, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


def stop_reason(reason: str, stop_sequence: str | None, calls: bool, full: bool = False) -> str:
    """`full`: the answer reached the end of the context."""
    if reason == "length":
        return "model_context_window_exceeded" if full else "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if calls else "end_turn"


class Blocks:
    """Parser deltas -> Anthropic stream events; `content` holds the blocks they add up to."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self._open: tuple | None = None          # ("text",), ("thinking",) or ("tool_use", call index)
        self._arguments: list[str] = []

    def add(self, delta: Delta) -> list[dict[str, Any]]:
        """The events `delta` makes."""
        call = delta.tool_call
        if call is not None:
            key: tuple = ("tool_use", call.index)
            events = [] if self._open == key else self._start(key, {
                "type": "tool_use", "id": tool_use_id(call.id), "name": call.name or "", "input": {}})
            if call.arguments:
                self._arguments.append(call.arguments)
                events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
            return events
        kind, text = ("thinking", delta.reasoning_content) if delta.reasoning_content is not None else \
            ("text", delta.content or "")
        if not text:
            return []
        events = [] if self._open == (kind,) else self._start((kind,), {"type": kind, kind: "", **(
            {"signature": ""} if kind == "thinking" else {})})
        self.content[-1][kind] += text
        return events + [self._delta({"type": KINDS[kind], kind: text})]

    def close(self) -> list[dict[str, Any]]:
        """The event that closes the open block, if one is open."""
        if self._open is None:
            return []
        if self._open[0] == "tool_use":
            try:
                arguments = json.loads("".join(self._arguments) or "{}")
            except ValueError:                   # not expected: the parser closes the JSON even of a cut call
                arguments = {}
            self.content[-1]["input"] = arguments if isinstance(arguments, dict) else {}
            self._arguments = []
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.content) - 1}]

    def _start(self, key: tuple, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self._open = key
        self.content.append(block)
        start = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return events + [{"type": "content_block_start", "index": len(self.content) - 1, "content_block": start}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}


class MessageReply:
    """One request's Anthropic message, whole (`message`) or as stream events (`start`, `piece`)."""

    def __init__(self, job: Job, mid: str, context: int, metrics: RouterMetrics | None = None):
        self.job, self.mid, self.context = job, mid, context
        self.reply = ChatReply(job, metrics)
        self.blocks = Blocks()
        self._reason: str | None = None

    def usage(self, d: Run) -> dict[str, int]:
        return usage(len(self.job.prompt_ids), d.cached_tokens, d.completion_tokens)

    def head(self, d: Run) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.job.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": self.usage(d)}

    def message(self, text: str, final: Run) -> dict[str, Any]:
        """The whole message of the generated `text`."""
        self.piece(text, final)
        return {**self.head(final), "content": self.blocks.content, "stop_reason": self._reason,
                "stop_sequence": final.stop_sequence}

    def start(self, first: Run) -> list[dict[str, Any]]:
        """message_start, with the usage known before the answer, and a ping."""
        return [{"type": "message_start", "message": self.head(first)}, {"type": "ping"}]

    def piece(self, text: str, d: Run) -> list[dict[str, Any]]:
        """The events of the next piece of generated text; the last piece (with a finish reason) ends
        the message."""
        if d.finish_reason is None:
            return [e for delta in self.reply.deltas(text) for e in self.blocks.add(delta)]
        deltas, _, parsed = self.reply.close(text, d.finish_reason)
        events = [e for delta in deltas for e in self.blocks.add(delta)] + self.blocks.close()
        full = len(self.job.prompt_ids) + d.completion_tokens >= self.context
        self._reason = stop_reason(d.finish_reason, d.stop_sequence, bool(parsed.tool_calls), full)
        return events + [{"type": "message_delta", "delta": {"stop_reason": self._reason,
                                                            "stop_sequence": d.stop_sequence}, "usage": self.usage(d)},
                         {"type": "message_stop"}]
