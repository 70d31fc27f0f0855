"""Replies: one choice's generated text -> OpenAI's chat message or stream of chat deltas, and the
plain text chunks of a streamed completion (TextStream), which stay the raw text.

Each choice runs one ChatOutputParser (services/router/frontend/chat): reasoning before `</think>` goes to
`reasoning_content`, Qwen3.6's XML tool calls to `tool_calls`, the rest to `content`. The part of
the answer that the prompt already holds (a forced `<tool_call>` start, see tools.py) is fed
first, so a named call's header goes out in the first chunk.

The finish reason follows vLLM, which follows OpenAI: "tool_calls" when a call was parsed under
tool_choice "auto" or "required", even when the token limit cut the answer; a named tool_choice
keeps the engine's reason ("stop" or "length"). A stream sends the role with empty content first,
one chunk per delta (reasoning, content, or one tool-call fragment: the header with id and name,
then pieces of the arguments), and the finish reason in a last chunk with an empty delta. Each
choice of a request for `n` > 1 has its own parser and stream, its chunks marked by `index`.

Logprobs, when asked for, go with the text (logprob_replies.py): a chunk carries those of the
tokens whose text it carries; the tokens of a piece the parser holds back go with the next chunk.
"""
from __future__ import annotations

import time
from typing import Any

from common.metrics import RouterMetrics

from ..engine import Delta as TextDelta
from .chat import ChatOutputParser, Delta, ParsedMessage
from .logprob_replies import Entry, Render
from .schema import Job

CALLS_FINISH = ("auto", "required")       # tool choices whose calls finish with "tool_calls"


class ChatReply:
    """The parser of one chat choice, and the OpenAI bodies it yields."""

    def __init__(self, job: Job, metrics: RouterMetrics | None = None, index: int = 0):
        self.job, self.metrics = job, metrics
        seed = job.sampling.for_choice(index).seed               # each choice its own call ids
        self.parser = ChatOutputParser(job.tools.parsed, reasoning=job.reasoning, seed=seed)
        self._pending = self.parser.feed(job.forced) if job.forced else []

    def deltas(self, text: str) -> list[Delta]:
        """The parser's deltas that `text`, the next piece of generated text, completes."""
        deltas, self._pending = self._pending + (self.parser.feed(text) if text else []), []
        return [d for d in deltas if self._kept(d)]

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The `delta` bodies that `text` completes."""
        return [d.as_openai() for d in self.deltas(text)]

    def close(self, text: str, reason: str) -> tuple[list[Delta], str, ParsedMessage]:
        """The last deltas, the finish reason, and the whole message."""
        deltas = self.deltas(text)
        tail, message = self.parser.finish()
        if message.failures and self.metrics is not None:
            self.metrics.tool_call_parse_failures.inc(message.failures)
        if not self.job.tools.parallel:
            message = ParsedMessage(message.reasoning_content, message.content, message.tool_calls[:1],
                                    message.failures)
        if message.tool_calls and self.job.tools.choice in CALLS_FINISH:
            reason = "tool_calls"
        return deltas + [d for d in tail if self._kept(d)], reason, message

    def finish(self, text: str, reason: str) -> tuple[list[dict[str, Any]], str, ParsedMessage]:
        """The last `delta` bodies, the finish reason, and the whole message."""
        deltas, reason, message = self.close(text, reason)
        return [d.as_openai() for d in deltas], reason, message

    def message(self, text: str, reason: str) -> tuple[dict[str, Any], str]:
        """The non-streamed `message` body of the whole `text`, and the finish reason."""
        _, reason, parsed = self.finish(text, reason)
        body = parsed.as_openai()
        if body["content"] is None and not parsed.tool_calls:
            body["content"] = ""                 # OpenAI's null content comes only with tool calls
        return body, reason

    def _kept(self, delta: Delta) -> bool:
        return self.job.tools.parallel or delta.tool_call is None or delta.tool_call.index == 0


def choice(job: Job, index: int, text: str, final: TextDelta, metrics: RouterMetrics | None = None,
           tokenizer=None) -> dict[str, Any]:
    """One choice of a non-streamed reply, of its whole text; `final` carries all of its logprobs."""
    logprobs = Render(tokenizer, job.chat)(final.logprobs) if job.sampling.logprobs else None
    if not job.chat:
        return {"index": index, "text": job.echo + text, "logprobs": logprobs, "finish_reason": final.finish_reason}
    message, reason = ChatReply(job, metrics, index).message(text, final.finish_reason)
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason}


class ChatStream:
    """The `chat.completion.chunk` bodies of one streamed chat request."""

    def __init__(self, job: Job, cid: str, metrics: RouterMetrics | None = None, index: int = 0, tokenizer=None):
        self.reply, self.index = ChatReply(job, metrics, index), index
        self.head = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": job.model}
        self.render = Render(tokenizer, True) if job.sampling.logprobs else None
        self.carry: list[Entry] = []                  # logprobs of text no chunk has carried yet

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self.head, "choices": [{"index": self.index, "delta": delta, "logprobs": None,
                                          "finish_reason": finish_reason}]}

    def start(self) -> list[dict[str, Any]]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def piece(self, text: str, finish_reason: str | None, logprobs: tuple[Entry, ...] = ()) -> list[dict[str, Any]]:
        """The chunks for the next piece of generated text; the last piece carries the finish reason."""
        if finish_reason is None:
            chunks = [self.chunk(d) for d in self.reply.feed(text)]
        else:
            bodies, reason, _ = self.reply.finish(text, finish_reason)
            chunks = [self.chunk(d) for d in bodies] + [self.chunk({}, reason)]
        self.carry.extend(logprobs)
        if self.render is not None and chunks and self.carry:
            chunks[0]["choices"][0]["logprobs"] = self.render(self.carry)
            self.carry = []
        return chunks

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": usage}


class TextStream:
    """The `text_completion` chunks of one streamed completion: the text as generated, after the
    prompt when `echo` asks for it."""

    def __init__(self, job: Job, cid: str, index: int = 0, tokenizer=None):
        self.echo, self.index = job.echo, index
        self.head = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": job.model}
        self.render = Render(tokenizer, False) if job.sampling.logprobs else None

    def start(self) -> list[dict[str, Any]]:
        return self.piece(self.echo, None) if self.echo else []

    def piece(self, text: str, finish_reason: str | None, logprobs: tuple[Entry, ...] = ()) -> list[dict[str, Any]]:
        body = self.render(logprobs) if self.render is not None else None
        return [{**self.head, "choices": [{"index": self.index, "text": text, "logprobs": body,
                                           "finish_reason": finish_reason}]}]

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": usage}
