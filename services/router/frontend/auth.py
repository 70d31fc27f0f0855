"""The HTTP API key: `Authorization: Bearer <key>`, or `x-api-key: <key>` as Anthropic's clients
send it, on every /v1/ path and /metrics when a key is set. A Bearer header, when sent, is the
one checked.

/health (and anything else outside those) stays open, so probes and load balancers need no key;
the middleware marks whether such a request showed the key, and /health gives its detail only
then (exposure.py).
A refused request gets 401 and `WWW-Authenticate: Bearer`, with an OpenAI-style error body, or
Anthropic's (authentication_error) on the /v1/messages routes.
"""
from __future__ import annotations

import hmac
import json

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ANTHROPIC_PREFIX, APIError
from .exposure import AUTHORIZED

PROTECTED_PREFIXES = ("/v1/", "/metrics")
MISSING = ("No API key provided. Send it in the Authorization header as Bearer auth: "
           "`Authorization: Bearer YOUR_KEY`, or as `x-api-key: YOUR_KEY` (the key the router was started with, "
           "--api-key / FERMIUM_API_KEY).")
WRONG = "Incorrect API key provided. Use the key the router was started with (--api-key / FERMIUM_API_KEY)."


def _key(scope: Scope) -> str | None:
    """The Bearer token, else the x-api-key header; "" for only another auth scheme, None for no key."""
    headers = dict(scope.get("headers", ()))
    found = None
    if b"authorization" in headers:
        scheme, _, token = headers[b"authorization"].decode("latin-1").partition(" ")
        if scheme.lower() == "bearer":
            return token.strip()
        found = ""
    if b"x-api-key" in headers:
        return headers[b"x-api-key"].decode("latin-1").strip()
    return found


class APIKeyMiddleware:
    """Pure ASGI, so streamed (SSE) responses pass through untouched."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = _key(scope)
        shown = bool(token) and hmac.compare_digest(token.encode(), self._key)
        if shown or not scope["path"].startswith(PROTECTED_PREFIXES):
            scope[AUTHORIZED] = shown
            return await self.app(scope, receive, send)
        err = APIError(401, MISSING if token is None else WRONG, code="invalid_api_key")
        anthropic = scope["path"].startswith(ANTHROPIC_PREFIX)
        body = json.dumps(err.anthropic_body() if anthropic else err.body()).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="fermium"')]})
        await send({"type": "http.response.body", "body": body})


def api_key_middleware(api_key: str | None) -> list[Middleware]:
    """The middleware list for Starlette(middleware=...): empty when no key is set."""
    return [Middleware(APIKeyMiddleware, api_key=api_key)] if api_key else []
