"""Errors the HTTP API answers with, in OpenAI's error body shape, on every route and status.

Starlette's own errors (404 for an unknown path, 405 for a wrong method) go through
`http_exception`; an exception that escapes a handler is caught by CatchAll, which answers
500 itself. Starlette's last-resort handler re-raises after answering, and uvicorn then
closes the keep-alive connection; CatchAll does not, so the connection stays usable.
"""
from __future__ import annotations

import json
import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("fermium.router")

TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
         429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def server_error(what: str, e: BaseException, code: str = "internal_error") -> APIError:
    return APIError(500, f"{what}: {type(e).__name__}: {e}", type="server_error", code=code)


class GenerationError(Exception):
    """A request that failed after it was admitted (a worker error or a lost worker)."""


class Drained(GenerationError):
    """A request the router ended because its drain time ran out."""


async def http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    where = f"{request.method} {request.url.path}"
    message = {404: f"Invalid URL ({where})", 405: f"Method not allowed ({where})"}.get(exc.status_code, exc.detail)
    kind = TYPES.get(exc.status_code, "server_error" if exc.status_code >= 500 else "invalid_request_error")
    return APIError(exc.status_code, message, type=kind, headers=dict(exc.headers or {})).response()


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
            body = json.dumps(server_error("the server failed on this request", e).body()).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
