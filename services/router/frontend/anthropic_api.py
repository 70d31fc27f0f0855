"""The Anthropic Messages API for Claude-compatible clients: POST /v1/messages, streamed or not,
and POST /v1/messages/count_tokens.

A request is translated (anthropic_request.py) into the body the chat route takes, validated into
the same Job and run by the same API.begin / collect, so admission, draining, disconnects and
the prefix cache behave alike; anthropic_reply.py renders the answer. A max_tokens past the
context is cut to what is left (Claude clients send a large one whatever the server's context), and an
answer that fills the context stops with "model_context_window_exceeded". Errors take Anthropic's
shape, {"type": "error", "error": {"type", "message"}}, with the status the chat route gives
(400 invalid_request_error, 404 not_found_error, 429 rate_limit_error, 503 overloaded_error);
a failure after the stream began is an `error` event, which ends it. Image blocks are read by
the router's vision tower (--mmproj) through anthropic_images.py, and counted by count_tokens.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import Delta
from .anthropic_images import AnthropicVision
from .anthropic_reply import MessageReply
from .anthropic_request import anthropic_param, openai_body
from .errors import APIError, failure
from .schema import Job, chat_prompt, check_model, parse_body, validate
from .tools import tool_plan
from .vision import ImageReads


def _event(body: dict[str, Any]) -> bytes:
    return f"event: {body['type']}\ndata: {json.dumps(body)}\n\n".encode()


class MessagesAPI:
    """The Anthropic routes of one API (api.py), which they share everything with."""

    def __init__(self, api):
        self.api = api

    def routes(self) -> list[Route]:
        return [Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])]

    def _job(self, raw: bytes) -> Job:
        api = self.api
        try:
            body, prefill = openai_body(parse_body(raw))
            return validate(body, chat=True, served=api.served, context=api.context, vocab=api.vocab,
                            encode=api.encode, render=api.render, prefill=prefill, clamp=True,
                            tokenizer=api.tokenizer, vision=AnthropicVision(getattr(api, "vision", None)),
                            template=api.template)
        except APIError as e:
            raise anthropic_param(e) from None

    def _count(self, raw: bytes) -> int:
        """The prompt's tokens, each image's run of image tokens counted whole."""
        api = self.api
        vision = AnthropicVision(getattr(api, "vision", None))
        reads = ImageReads(vision)
        try:
            body, prefill = openai_body(parse_body(raw), count=True)
            check_model(body["model"], api.served)
            text, _ = chat_prompt(body, tool_plan(body), api.render, prefill, reads, api.template)
            ids = api.template.encode(text) if api.template is not None else api.encode(text)
            return len(vision.expand(ids, reads.read)[0] if reads.read else ids)
        except APIError as e:
            raise anthropic_param(e) from None

    async def messages(self, request: Request) -> Response:
        try:
            started = await self.api.begin(request, self._job)
        except APIError as e:
            return e.anthropic_response()
        if started is None:
            return Response(status_code=499)
        job, head, deltas = started
        reply = MessageReply(job, f"msg_{uuid.uuid4().hex}", self.api.context, self.api.engine.metrics)
        if job.stream:
            return StreamingResponse(self._stream(reply, head, deltas), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            whole = await self.api.collect(request, head, deltas)
        except APIError as e:
            return e.anthropic_response()
        if whole is None:
            return Response(status_code=499)
        return JSONResponse(reply.message(*whole))

    async def _stream(self, reply: MessageReply, head: Delta, deltas: AsyncIterator[Delta]) -> AsyncIterator[bytes]:
        try:
            for event in reply.start(head) + reply.piece(head.text, head):
                yield _event(event)
            async for d in deltas:
                for event in reply.piece(d.text, d):
                    yield _event(event)
        except Exception as e:
            yield _event(failure(e).anthropic_body())

    async def count_tokens(self, request: Request) -> Response:
        try:
            n = await self.api.parse(request, self._count)
        except APIError as e:
            return e.anthropic_response()
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse({"input_tokens": n})
