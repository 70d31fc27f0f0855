"""What the router shows to whom: the API key checked at start, /health's detail only to holders of
the key, /metrics on the API port (behind the key, auth.py), and server-side error messages to
clients without the deployment's internal addresses and worker ids.

An operator reads the detail in the logs and, with the key, in /health; a client without the key
learns only that the service is up or not.
"""
from __future__ import annotations

import os
import re

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.errors import UserError

API_KEY_ENV = "FERMIUM_API_KEY"
AUTHORIZED = "fermium.authorized"       # the ASGI scope key auth.py sets on the open paths

# a ZeroMQ or URL address (tcp://host:port, ipc://path, local://name), with its "at " when it has one
_AT_ADDRESS = re.compile(r"\s+at\s+[a-z][a-z0-9+.-]*://[^\s`'\")]+")
_ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*://[^\s`'\")]+")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_WORKER_ID = re.compile(r"\s*\b(?:prefill|decode)-[0-9a-f]{8}\b")     # common/worker.py's ids
HIDDEN = "ADDRESS"


class EmptyAPIKey(UserError, ValueError):
    """An API key that is set but empty: refused, rather than serving without one."""


def check_api_key(api_key: str | None, environ=os.environ) -> str | None:
    """The key the router requires (None: none), refusing one set but empty or blank, whether as
    --api-key "" or as FERMIUM_API_KEY= (which the option parser reads as unset)."""
    if api_key is None and environ.get(API_KEY_ENV) is not None:
        api_key = environ[API_KEY_ENV]
    if api_key is not None and not api_key.strip():
        raise EmptyAPIKey(f"the API key is set but empty ({API_KEY_ENV} or --api-key); set a key, or unset "
                          f"{API_KEY_ENV} to serve without one")
    return api_key


def public(message: str) -> str:
    """A server-side message with its internal addresses and worker ids taken out."""
    message = _AT_ADDRESS.sub("", message)
    message = _WORKER_ID.sub("", _IP.sub(HIDDEN, _ADDRESS.sub(HIDDEN, message)))
    return message


def authorized(request: Request) -> bool:
    """Whether the request showed the API key (always, where none is set)."""
    return request.scope.get(AUTHORIZED, True)


def health_response(request: Request, status: str, code: int, detail: dict) -> Response:
    """/health: the detail to holders of the key, else only ok or unavailable."""
    if authorized(request):
        return JSONResponse({"status": status, **detail}, status_code=code)
    return JSONResponse({"status": "ok" if code == 200 else "unavailable"}, status_code=code)


def metrics_route(registry) -> Route:
    """/metrics of `registry` on the API port."""
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return Route("/metrics", metrics, methods=["GET"])
