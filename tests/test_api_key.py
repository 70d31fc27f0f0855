"""The router's API key: Bearer auth enforced on /v1/*, /health open, OpenAI-style 401 bodies."""
from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from services.router.frontend.auth import api_key_middleware

KEY = "sk-fermium-test-0123456789"
ROUTER_START_S = 60     # one Python process loading a tiny model on a shared 2-core machine


def _app(api_key: str | None) -> Starlette:
    async def health(request):
        return JSONResponse({"ok": True})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def chat(request):
        async def events():
            for word in ("a", "b", "c"):
                yield f"data: {word}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", chat, methods=["POST"])]
    return Starlette(routes=routes, middleware=api_key_middleware(api_key))


@pytest.fixture
def client():
    with TestClient(_app(KEY)) as c:
        yield c


def _assert_openai_401(r, needle: str) -> None:
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert needle in err["message"]


def test_missing_key_is_refused_with_a_clear_body(client):
    _assert_openai_401(client.get("/v1/models"), "Authorization: Bearer")
    _assert_openai_401(client.post("/v1/chat/completions", json={}), "Authorization: Bearer")


@pytest.mark.parametrize("header", [f"Bearer {KEY}x", "Bearer ", f"Basic {KEY}", KEY])
def test_wrong_key_or_scheme_is_refused(client, header):
    r = client.get("/v1/models", headers={"Authorization": header})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_right_key_passes_and_streams(client):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
    r = client.post("/v1/chat/completions", json={}, headers=auth)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")


def test_health_stays_open(client):
    assert client.get("/health").json() == {"ok": True}


def test_no_key_configured_leaves_the_api_open():
    with TestClient(_app(None)) as c:
        assert c.get("/v1/models").status_code == 200


def test_openai_client_sees_an_authentication_error():
    openai = pytest.importorskip("openai")
    with TestClient(_app(KEY), base_url="http://router") as http:   # an httpx.Client over the app
        def models(key: str):
            return openai.OpenAI(base_url="http://router/v1", api_key=key, max_retries=0,
                                 http_client=http).models.list()
        with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
            models("wrong")
        assert [m.id for m in models(KEY)] == ["tiny"]


def test_router_process_enforces_the_key(tmp_path):
    """`fermium router` with FERMIUM_API_KEY (the systemd env file's way), no workers needed."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from fermium.stack import free_port
    from tests.stack_helpers import write_tiny_gguf

    port = free_port()
    env = {**os.environ, "FERMIUM_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "fermium", "router",
                             "--model", str(write_tiny_gguf(tmp_path / "m.gguf")), "--port", str(port), "--workers", f"tcp://127.0.0.1:{free_port()}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ROUTER_START_S
        while True:
            assert proc.poll() is None, "the router exited"
            try:
                health = httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the router did not start"
                time.sleep(0.2)
        assert health.status_code in (200, 503), health.text      # 503: no workers; no key asked either way
        r = httpx.get(f"{url}/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["data"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
