"""Errors the HTTP API answers with, in OpenAI's error body shape, on every route and status, and
the statuses the engine's errors (engine/errors.py) take (`failure`).

Starlette's own errors (404 for an unknown path, 405 for a wrong method) go through
`http_exception`; an exception that escapes a handler is caught by CatchAll, which answers
500 itself. Starlette's last-resort handler re-raises after answering, and uvicorn then
closes the keep-alive connection; CatchAll does not, so the connection stays usable.
On the Anthropic routes (/v1/messages...) the same errors take Anthropic's shape (`anthropic_body`).
A server-side error's message (5xx) reaches the client without internal addresses or worker ids
(exposure.py `public`); the logs keep them.
"""
from __future__ import annotations

import json
import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine import Busy, DispatchFailed, Drained, EngineError, GenerationError, NoWorkers, Stalled
from .exposure import public

log = logging.getLogger("fermium.router")

TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
         429: "rate_limit_error", 503: "service_unavailable"}
ANTHROPIC_PREFIX = "/v1/messages"
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error"}
RETRY_AFTER_S = 1


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        message = public(message) if status >= 500 else message
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def anthropic_body(self) -> dict:
        """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def anthropic_response(self) -> JSONResponse:
        return JSONResponse(self.anthropic_body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def server_error(what: str, e: BaseException, code: str = "internal_error") -> APIError:
    return APIError(500, f"{what}: {type(e).__name__}: {e}", type="server_error", code=code)


# an engine error -> (status, type, code); a 429 or 503 tells the client when to retry
ENGINE_ERRORS: list[tuple[type[EngineError], int, str, str]] = [
    (Busy, 429, "rate_limit_error", "queue_full"),
    (NoWorkers, 503, "service_unavailable", "no_workers"),
    (Drained, 503, "service_unavailable", "shutting_down"),
    (Stalled, 503, "service_unavailable", "worker_stalled"),
    (DispatchFailed, 500, "server_error", "dispatch_failed"),
    (GenerationError, 500, "server_error", "worker_failed"),
]


def failure(e: Exception) -> APIError:
    """What a request that the engine refused, or that failed after admission, answers with."""
    for kind, status, type_, code in ENGINE_ERRORS:
        if isinstance(e, kind):
            retry = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
            return APIError(status, str(e), type=type_, code=code, headers=retry)
    log.error("router: a request failed", exc_info=e)
    return server_error("the server failed on this request", e)


async def http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    where = f"{request.method} {request.url.path}"
    message = {404: f"Invalid URL ({where})", 405: f"Method not allowed ({where})"}.get(exc.status_code, exc.detail)
    kind = TYPES.get(exc.status_code, "server_error" if exc.status_code >= 500 else "invalid_request_error")
    err = APIError(exc.status_code, message, type=kind, headers=dict(exc.headers or {}))
    return err.anthropic_response() if request.url.path.startswith(ANTHROPIC_PREFIX) else err.response()


class CatchAll:
    """Pure ASGI: an unexpected exception is logged and answered as a JSON 500, never re-raised."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            log.exception("router: %s %s failed", scope.get("method"), scope.get("path"))
            if started:         # a body already under way cannot turn into an error
                raise
            err = server_error("the server failed on this request", e)
            anthropic = str(scope.get("path", "")).startswith(ANTHROPIC_PREFIX)
            body = json.dumps(err.anthropic_body() if anthropic else err.body()).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
