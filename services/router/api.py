"""The OpenAI-compatible HTTP API (starlette): routes, response bodies, SSE framing.

The first Delta of a request is awaited before the response starts, so admission (429),
missing workers (503) and early worker failures come back as HTTP errors; after that, a
failure is sent as an SSE `error` event. A client that disconnects cancels its request.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import APIError, GenerationError
from .generation import Delta, Generation
from .schema import Job, parse_body, validate

log = logging.getLogger("fermium.router")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class API:
    def __init__(self, generation: Generation, *, served: tuple[str, ...], context: int, vocab: int,
                 encode: Callable[[str], list[int]], render: Callable[[list[dict], dict], str],
                 health: Callable[[], dict]):
        self.gen, self.served, self.context, self.vocab = generation, served, context, vocab
        self.encode, self.render, self.health_info = encode, render, health

    def routes(self) -> list[Route]:
        return [Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"])]

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.served[0], "object": "model", "created": 0, "owned_by": "fermium",
             "max_model_len": self.context}]})

    async def health(self, request: Request) -> Response:
        info = self.health_info()
        ok = info["prefill_workers"] > 0 and info["decode_workers"] > 0
        return JSONResponse({"status": "ok" if ok else "degraded", **info}, status_code=200 if ok else 503)

    async def chat(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def _serve(self, request: Request, *, chat: bool) -> Response:
        arrived = time.perf_counter()
        try:
            body = parse_body(await request.body())
            job = validate(body, chat=chat, served=self.served, context=self.context, vocab=self.vocab,
                           encode=self.encode, render=self.render)
            await self.gen.admit()
        except APIError as e:
            return _error(e)
        deltas = self.gen.run(job, arrived)
        first: list[Delta] = []

        async def head() -> None:
            first.append(await deltas.__anext__())

        try:
            await _first_of(head(), _until_disconnect(request))
        except APIError as e:
            return _error(e)
        except GenerationError as e:
            return _error(APIError(500, str(e), type="server_error", code="worker_failed"))
        if not first:  # the client left before the first token
            await deltas.aclose()
            return Response(status_code=499)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if job.stream:
            return StreamingResponse(self._stream(job, cid, first[0], deltas), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._whole(request, job, cid, first[0], deltas)

    async def _whole(self, request: Request, job: Job, cid: str, head: Delta,
                     deltas: AsyncIterator[Delta]) -> Response:
        parts, final = [head.text], head

        async def rest() -> None:
            nonlocal final
            async for d in deltas:
                parts.append(d.text)
                final = d

        try:
            await _first_of(rest(), _until_disconnect(request))     # also closes a run that ended at once
        except GenerationError as e:
            return _error(APIError(500, str(e), type="server_error", code="worker_failed"))
        if final.finish_reason is None:
            return Response(status_code=499)
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": final.finish_reason} if job.chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": final.finish_reason})
        return JSONResponse({"id": cid, "object": "chat.completion" if job.chat else "text_completion",
                             "created": int(time.time()), "model": job.model, "choices": [choice],
                             "usage": _usage(final)})

    async def _stream(self, job: Job, cid: str, head: Delta, deltas: AsyncIterator[Delta]) -> AsyncIterator[bytes]:
        created = int(time.time())
        kind = "chat.completion.chunk" if job.chat else "text_completion"

        def chunk(d: Delta, role: bool = False) -> dict:
            if job.chat:
                delta = {"role": "assistant", "content": d.text} if role else {"content": d.text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
            else:
                choice = {"index": 0, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason}
            return {"id": cid, "object": kind, "created": created, "model": job.model, "choices": [choice]}

        final = head
        yield _sse(chunk(head, role=True))
        try:
            async for d in deltas:
                final = d
                yield _sse(chunk(d))
        except GenerationError as e:
            yield _sse(APIError(500, str(e), type="server_error", code="worker_failed").body())
            return
        if job.include_usage:
            yield _sse({"id": cid, "object": kind, "created": created, "model": job.model, "choices": [],
                        "usage": _usage(final)})
        yield _sse("[DONE]")


def _usage(d: Delta) -> dict:
    return {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
            "total_tokens": d.prompt_tokens + d.completion_tokens}


async def _first_of(*coros) -> None:
    """Run until the first finishes; cancel the others; re-raise its error."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        t.result()

