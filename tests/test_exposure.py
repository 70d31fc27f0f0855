"""What the router shows to whom (services/router/frontend/exposure.py): server-side error messages without
internal addresses or worker ids, an API key set but empty refused at start (a real router
process), /health's detail only with the key, and metrics listening where the service listens."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from common.metrics_host import MetricsHostError, listen_host
from services.router.engine import GenerationError
from services.router.frontend.auth import api_key_middleware
from services.router.frontend.errors import APIError, bad_request, failure
from services.router.frontend.exposure import EmptyAPIKey, check_api_key, health_response, public

KEY = "sk-fermium-test-0123456789"
# the dispatcher's own wordings (services/router/engine/dispatch.py), as a failed request's client saw them
INTERNAL = [
    "decode worker decode-1a2b3c4d at tcp://10.0.0.5:5561 stopped responding (no heartbeat for 2.5 s)",
    "prefill worker prefill-00ff00ff at tcp://[::1]:40123 stopped responding (its connection closed)",
    "decode worker decode-deadbeef at ipc:///run/fermium/decode was restarted",
    "no decode worker is connected; start one with `fermium decode --router tcp://0.0.0.0:5560`",
    "redis at 10.0.0.1:6379 refused the connection",
]


@pytest.mark.parametrize("message", INTERNAL)
def test_server_errors_reach_clients_without_addresses_or_worker_ids(message):
    for err in (failure(GenerationError(message)), APIError(503, message, type="service_unavailable")):
        shown = err.body()["error"]["message"]
        assert "://" not in shown and "10.0.0" not in shown and "[::1]" not in shown
        assert not any(w in shown for w in ("1a2b3c4d", "00ff00ff", "deadbeef")), shown
        assert ("decode" in shown or "prefill" in shown or "redis" in shown) and "  " not in shown
        assert err.anthropic_body()["error"]["message"] == shown


def test_client_errors_keep_their_text():
    """A 400 quotes what the client sent; nothing of the server's is in it to hide."""
    message = "messages[0].content: see tcp://example.org:80 and 10.1.2.3"
    assert bad_request(message).body()["error"]["message"] == message
    assert public("the server failed: ValueError: bad") == "the server failed: ValueError: bad"


@pytest.mark.parametrize("flag, env", [("", None), ("  ", None), (None, ""), (None, " \t")])
def test_an_empty_api_key_is_refused(flag, env):
    environ = {} if env is None else {"FERMIUM_API_KEY": env}
    with pytest.raises(EmptyAPIKey, match="set but empty"):
        check_api_key(flag, environ)


def test_a_key_or_none_passes():
    assert check_api_key(None, {}) is None
    assert check_api_key(KEY, {"FERMIUM_API_KEY": ""}) == KEY, "the flag wins over the environment"
    assert check_api_key(None, {"FERMIUM_API_KEY": KEY}) == KEY


def test_the_router_process_stops_on_an_empty_key(tmp_path):
    """`FERMIUM_API_KEY=` in the env file (or the shell) used to serve without a key, silently."""
    from tests.stack_helpers import write_tiny_gguf
    env = {**os.environ, "FERMIUM_API_KEY": ""}
    proc = subprocess.run([sys.executable, "-m", "fermium", "router", "--model",
                           str(write_tiny_gguf(tmp_path / "m.gguf")), "--port", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "FERMIUM_API_KEY" in proc.stderr and "empty" in proc.stderr
    assert "Traceback" not in proc.stderr


def _health_app(api_key: str | None, code: int) -> Starlette:
    async def health(request):
        return health_response(request, "degraded" if code == 503 else "ok", code,
                               {"workers": [{"id": "decode-1a2b3c4d", "address": "tcp://10.0.0.5:5561"}]})
    return Starlette(routes=[Route("/health", health)], middleware=api_key_middleware(api_key))


@pytest.mark.parametrize("code, status", [(200, "ok"), (503, "unavailable")])
def test_health_detail_only_with_the_key(code, status):
    with TestClient(_health_app(KEY, code)) as c:
        bare = c.get("/health")
        assert bare.status_code == code and bare.json() == {"status": status}
        assert c.get("/health", headers={"x-api-key": "wrong"}).json() == {"status": status}
        full = c.get("/health", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert full["workers"][0]["address"] == "tcp://10.0.0.5:5561"
    with TestClient(_health_app(None, code)) as c:       # no key set: the API is open, and so is the detail
        assert "workers" in c.get("/health").json()


@pytest.mark.parametrize("address, host", [("tcp://127.0.0.1:0", "127.0.0.1"), ("tcp://*:5561", "0.0.0.0"),
                                           ("tcp://10.0.0.2:5561", "10.0.0.2"), ("tcp://[::1]:5561", "::1"),
                                           ("ipc:///run/fermium/decode", "127.0.0.1"), ("local://decode", "127.0.0.1")])
def test_worker_metrics_listen_on_the_inbox_host(address, host):
    assert listen_host(address) == host


def test_an_interface_name_asks_for_metrics_host():
    """ZeroMQ binds tcp://eth0:5561; an HTTP server cannot, and the worker says so at start."""
    with pytest.raises(MetricsHostError, match="--metrics-host"):
        listen_host("tcp://fermium-no-such-interface0:5561")
