"""The OpenAI-compatible HTTP API (starlette): routes, response bodies, SSE framing. Chat answers
are split into reasoning, content and tool calls by replies.py; completions stay raw text.

The engine (engine/engine.py) admits and runs each Job's Request; its errors take their HTTP
status in errors.py `failure`. The first Delta of a request is awaited before the response
starts, so admission (429), missing workers (503) and early worker failures come back as HTTP
errors; after that, a
failure is sent as an SSE `error` event, then `[DONE]`. A client that disconnects cancels its
request. Parsing, validation, the chat template and tokenizing run on a small thread pool, so a
large body never holds up the event loop.

Draining (on SIGTERM, see services/router/server.py): new requests get 503, the ones under way have
`drain_timeout` seconds to finish, and those left then end with an error.

`begin` and `collect` are that life, shared with the Anthropic Messages API (anthropic_api.py),
which renders the same Job's deltas in its own shapes. Usage reports the prompt tokens served
from the prefix cache as `prompt_tokens_details.cached_tokens`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, Sequence, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from common.grammar import Vocab

from ..config import RouterConfig
from ..engine import Delta, Engine, EngineError
from .anthropic_api import MessagesAPI
from .disconnects import admitted, first_of, until_disconnect
from .errors import RETRY_AFTER_S, APIError, CatchAll, failure, http_exception
from .exposure import health_response
from .replies import ChatStream, TextStream, choice
from .schema import Job, TemplateTokens, check_model, parse_body, validate
from .vision import VisionInput

log = logging.getLogger("fermium.router")

VALIDATE_THREADS = 2            # bodies parsed and tokenized at once, off the event loop
DRAIN_POLL_S = 0.05
ABORT_GRACE_S = 1.0             # after the drain time, for the ended requests to send their error
T = TypeVar("T")
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages")


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


class API:
    def __init__(self, engine: Engine, *, served: tuple[str, ...], context: int, vocab: int,
                 encode: Callable[[str], list[int]], render: Callable[[list[dict], dict], str],
                 max_body: int = RouterConfig.max_body_bytes,
                 decode: Callable[[list[int]], str] | None = None, tokenizer: Vocab | None = None,
                 vision: VisionInput | None = None, template: TemplateTokens | None = None,
                 max_n: int = RouterConfig.max_n):
        self.engine, self.served, self.context, self.vocab = engine, served, context, vocab
        self.tokenizer, self.vision, self.template = tokenizer, vision, template
        self.encode, self.decode, self.render = encode, decode, render
        self.max_body, self.max_n = max_body, max_n
        self.draining = False
        self.live = 0                   # completion requests under way, counted by _Inflight
        self._pool = ThreadPoolExecutor(VALIDATE_THREADS, thread_name_prefix="router-validate")

    def app(self, *, lifespan=None, middleware: Sequence[Middleware] = (), extra: Sequence[Route] = ()) -> Starlette:
        """The ASGI app: these routes and `extra`, OpenAI error bodies for every status, requests counted."""
        return Starlette(routes=[*self.routes(), *extra], lifespan=lifespan,
                         middleware=[Middleware(CatchAll), Middleware(_Inflight, api=self), *middleware],
                         exception_handlers={HTTPException: http_exception})

    async def drain(self, timeout: float) -> None:
        """Refuse new requests; wait up to `timeout` s for those under way, then end the rest."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        log.info("router: draining %d requests (at most %.0f s)", self.live, timeout)
        while self.live and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self.live:
            n = self.engine.abort_all(f"the server is shutting down; the request did not finish within "
                                   f"the drain time of {timeout:g} s")
            log.warning("router: drain time ran out; ending %d requests", n)
            deadline = loop.time() + ABORT_GRACE_S
            while self.live and loop.time() < deadline:
                await asyncio.sleep(DRAIN_POLL_S)

    def routes(self) -> list[Route]:
        return [Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                *MessagesAPI(self).routes(),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                Route("/health", self.health, methods=["GET"])]

    def _model(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "fermium", "max_model_len": self.context}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model(self.served[0])]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        try:
            check_model(name, self.served)
        except APIError as e:
            return e.response()
        return JSONResponse(self._model(name))

    async def health(self, request: Request) -> Response:
        info = self.engine.health()
        ok = not self.draining and info["prefill_workers"] > 0 and info["decode_workers"] > 0 \
            and not info.get("stalled")
        status = "draining" if self.draining else "ok" if ok else "degraded"
        return health_response(request, status, 200 if ok else 503, info)

    async def chat(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def parse(self, request: Request, build: Callable[[bytes], T]) -> T:
        """`build` of the body (refused past max_body bytes), run on the validation pool."""
        raw = await _read_body(request, self.max_body)
        return await asyncio.get_running_loop().run_in_executor(self._pool, build, raw)

    async def begin(self, request: Request,
                    build: Callable[[bytes], Job]) -> tuple[Job, Delta, AsyncIterator[Delta]] | None:
        """Read the body, build its Job on the pool, admit it and await its first Delta: (job, first
        Delta, the rest). None when the client left first; an APIError when the request fails."""
        arrived = time.perf_counter()
        if self.draining:
            raise APIError(503, "the server is shutting down; send the request to another instance or "
                           "retry once it is back", type="service_unavailable", code="shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            job = await self.parse(request, build)
        except ClientDisconnect:
            return None
        try:
            if not await admitted(request, lambda: self.engine.admit(job.n)):
                return None
        except EngineError as e:
            raise failure(e) from None
        deltas = self.engine.stream(job.request(), arrived)
        first: list[Delta] = []

        async def head() -> None:
            first.append(await deltas.__anext__())

        try:
            await first_of(head(), until_disconnect(request))
        except Exception as e:
            raise failure(e) from None
        if not first:  # the client left before the first token
            await deltas.aclose()
            return None
        return job, first[0], deltas

    async def collect(self, request: Request, head: Delta, deltas: AsyncIterator[Delta]) -> tuple[str, Delta] | None:
        """The whole text and the final Delta; None when the client left first."""
        whole = await self.collect_choices(request, head, deltas, 1)
        return None if whole is None else whole[0]

    async def collect_choices(self, request: Request, head: Delta, deltas: AsyncIterator[Delta],
                              n: int) -> list[tuple[str, Delta]] | None:
        """Each choice's whole text and final Delta, which carries all of its logprobs, by index; None
        when the client left first."""
        parts: list[list[str]] = [[] for _ in range(n)]
        finals: list[Delta | None] = [None] * n
        logprobs: list[list] = [[] for _ in range(n)]

        def take(d: Delta) -> None:
            parts[d.index].append(d.text)
            logprobs[d.index].extend(d.logprobs)
            if d.finish_reason is not None:
                finals[d.index] = d

        async def rest() -> None:
            async for d in deltas:
                take(d)

        take(head)
        try:
            await first_of(rest(), until_disconnect(request))     # also closes a run that ended at once
        except Exception as e:
            raise failure(e) from None
        if any(f is None for f in finals):
            return None
        return [("".join(p), dataclasses.replace(f, logprobs=tuple(lp))) for p, f, lp in zip(parts, finals, logprobs)]

    async def _serve(self, request: Request, *, chat: bool) -> Response:
        try:
            started = await self.begin(request, lambda raw: self._job(raw, chat))
        except APIError as e:
            return e.response()
        if started is None:
            return Response(status_code=499)
        job, head, deltas = started
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if job.stream:
            return StreamingResponse(self._stream(job, cid, head, deltas), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            whole = await self.collect_choices(request, head, deltas, job.n)
        except APIError as e:
            return e.response()
        if whole is None:
            return Response(status_code=499)
        choices = [choice(job, i, text, final, self.engine.metrics, self.engine.tokenizer)
                   for i, (text, final) in enumerate(whole)]
        return JSONResponse({"id": cid, "object": "chat.completion" if job.chat else "text_completion",
                             "created": int(time.time()), "model": job.model, "choices": choices,
                             "usage": _usage([f for _, f in whole])})

    def _job(self, raw: bytes, chat: bool) -> Job:
        return validate(parse_body(raw), chat=chat, served=self.served, context=self.context, vocab=self.vocab,
                        encode=self.encode, render=self.render, decode=self.decode, tokenizer=self.tokenizer,
                        vision=self.vision, template=self.template, max_n=self.max_n)

    async def _stream(self, job: Job, cid: str, head: Delta, deltas: AsyncIterator[Delta]) -> AsyncIterator[bytes]:
        outs = [ChatStream(job, cid, self.engine.metrics, i, self.engine.tokenizer) if job.chat
                else TextStream(job, cid, i, self.engine.tokenizer) for i in range(job.n)]
        finals: list[Delta] = [head] * job.n
        try:
            for body in [b for out in outs for b in out.start()] + outs[head.index].piece(
                    head.text, head.finish_reason, head.logprobs):
                yield _sse(body)
            async for d in deltas:
                finals[d.index] = d
                for body in outs[d.index].piece(d.text, d.finish_reason, d.logprobs):
                    yield _sse(body)
        except Exception as e:
            yield _sse(failure(e).body())
            yield _sse("[DONE]")
            return
        if job.include_usage:
            yield _sse(outs[0].usage(_usage(finals)))
        yield _sse("[DONE]")


def _usage(finals: list[Delta]) -> dict:
    """One request's usage: the prompt once, the completion tokens of every choice."""
    d, completion = finals[0], sum(f.completion_tokens for f in finals)
    return {"prompt_tokens": d.prompt_tokens, "completion_tokens": completion,
            "total_tokens": d.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": d.cached_tokens}}


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes; uvicorn discards the unread rest."""
    too_large = APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


class _Inflight:
    """Counts the completion requests under way, streams included, until their last byte."""

    def __init__(self, app: ASGIApp, api: API):
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in COMPLETION_PATHS:
            return await self.app(scope, receive, send)
        self.api.live += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.api.live -= 1
