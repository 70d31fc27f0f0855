"""Hostile HTTP against a real uvicorn server on loopback (the in-process LocalDispatcher: the
real router, prefill and decode servers on threads, with a counting runner, behind it): a
seeded generator sends N_CASES requests over both completion routes, over a few keep-alive
connections. No answer is a 5xx, no connection is reset or closed, every error is in OpenAI's
shape, and a normal request is answered right afterwards."""
from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.model.chat_template import render_chat
from fermium.local import LocalDispatcher
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.frontend.api import API
from tests.hostile_cases import MODEL, ROUTES, fixed_cases, generated_cases
from tests.http_helpers import serve_app
from tests.stack_helpers import CHATML
from tests.test_api_errors import ByteTokenizer, CountingRunner, assert_error, completion, lifespan, make_app

SEED = 27
N_CASES = 10_000
CONNECTIONS = 4
CONTEXT = 160
LOOP_STALL_LIMIT_S = 0.25            # a /health answer while a 1 MB body is tokenized


def make_api(dispatcher=None, render=None, encode=None) -> API:
    tok = ByteTokenizer()

    def chat(messages, kwargs):
        extra = dict(kwargs)
        return render_chat(messages, template=CHATML, enable_thinking=bool(extra.pop("enable_thinking", True)),
                           template_kwargs=extra)
    engine = Engine(tok, dispatcher or LocalDispatcher(CountingRunner()), Admission(8, 64), RouterMetrics(), 30.0)
    return API(engine, served=(MODEL,), context=CONTEXT, vocab=tok.vocab_size, encode=encode or tok.encode,
               render=render or chat)


class Peers:
    """Records the client address of every request: one per connection that was used."""

    def __init__(self, app):
        self.app, self.seen = app, set()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.seen.add(tuple(scope["client"]))
        await self.app(scope, receive, send)


@contextlib.contextmanager
def serving(api: API):
    app = Peers(api.app(lifespan=lifespan(api.engine.dispatcher)))
    with serve_app(app) as url:
        yield url, app


def is_error_shape(r: httpx.Response) -> bool:
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
            and isinstance(err["message"], str) and isinstance(err["type"], str))


def check(method: str, path: str, r: httpx.Response) -> str:
    """'' when the answer is sound, else what is wrong with it."""
    if r.status_code >= 500:
        return f"{r.status_code}"
    if r.status_code >= 300:
        return "" if is_error_shape(r) else "shape"
    if path in ROUTES and r.headers["content-type"].startswith("text/event-stream"):
        return "" if r.text.endswith("data: [DONE]\n\n") else "stream"
    return "" if isinstance(r.json(), dict) else "body"


def normal_requests_work(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "bcd", r.text
    r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text


def test_ten_thousand_hostile_requests():
    rng = random.Random(SEED)
    cases = fixed_cases()
    cases += generated_cases(rng, N_CASES - len(cases))
    statuses, problems, resets = Counter(), Counter(), Counter()
    with serving(make_api()) as (url, peers):
        def send(share: list) -> None:
            with httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1)) as c:
                for method, path, content in share:
                    try:
                        r = c.request(method, path, content=content)
                    except httpx.TransportError as e:
                        resets[type(e).__name__] += 1
                        continue
                    statuses[r.status_code] += 1
                    if what := check(method, path, r):
                        problems[what] += 1
        t0 = time.perf_counter()
        threads = [threading.Thread(target=send, args=(cases[i::CONNECTIONS],)) for i in range(CONNECTIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        connections = len(peers.seen)
        with httpx.Client(base_url=url, timeout=30) as c:
            normal_requests_work(c)
    print(f"\nhostile HTTP: {len(cases)} cases in {elapsed:.1f} s over {connections} connections; "
          f"status {dict(sorted(statuses.items()))}; 5xx {sum(v for k, v in statuses.items() if k >= 500)}; "
          f"resets {sum(resets.values())}; bad answers {dict(problems)}")
    assert len(cases) >= N_CASES
    assert not resets and not problems and all(s < 500 for s in statuses)
    assert connections == CONNECTIONS                        # nothing closed a connection
    assert statuses[200] > 1000 and statuses[400] > 1000     # the generator reaches both sides


class FailingRunner(CountingRunner):
    def decode(self, tokens, states):
        raise RuntimeError("the engine broke")


def test_a_500_keeps_the_connection_and_a_failed_stream_ends_with_done():
    def render(messages, kwargs):
        raise RuntimeError("a bug in the template")          # escapes the handler: CatchAll answers
    with serving(make_api(LocalDispatcher(FailingRunner()), render=render)) as (url, peers):
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "a"}]})
            assert r.status_code == 500 and is_error_shape(r) and r.json()["error"]["type"] == "server_error"
            body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "stream": True, "temperature": 0}
            r = c.post("/v1/completions", json=body)
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert "the engine broke" in json.loads(events[-2])["error"]["message"] and events[-1] == "[DONE]"
            r = c.post("/v1/completions", json=body | {"max_tokens": 1, "stream": False})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "b"
        assert len(peers.seen) == 1


def test_a_large_body_does_not_hold_up_the_event_loop(tmp_path: Path):
    from common.model.gguf_file import GGUFModel
    from common.model.tokenizer import Tokenizer
    from tests.stack_helpers import write_tiny_gguf
    tok = Tokenizer.from_gguf(GGUFModel(str(write_tiny_gguf(tmp_path / "tiny.gguf"))))
    prompt = ("the cat sat on the mat. " * 50_000)[:1 << 20]
    with serving(make_api(encode=tok.encode)) as (url, _):
        done, stalls = threading.Event(), []

        def post() -> None:
            r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            done.set()
        with httpx.Client(base_url=url, timeout=10) as c:
            c.get("/health")
            thread = threading.Thread(target=post)
            t0 = time.perf_counter()
            thread.start()
            while not done.is_set():
                t = time.perf_counter()
                assert c.get("/health").status_code == 200
                stalls.append(time.perf_counter() - t)
                time.sleep(0.005)
            thread.join()
    print(f"\n1 MB prompt: answered in {time.perf_counter() - t0:.2f} s; {len(stalls)} /health probes meanwhile, "
          f"the slowest {max(stalls) * 1000:.0f} ms")
    assert len(stalls) > 5 and max(stalls) < LOOP_STALL_LIMIT_S


# ---- the cases one by one, with the message and the field they must name

@pytest.fixture(scope="module")
def client():
    with TestClient(make_app(LocalDispatcher(CountingRunner()))) as c:
        yield c


@pytest.mark.parametrize("field, value, needle", [
    ("temperature", 1e-320, "0 (greedy) or in [0.001, 2]"), ("repetition_penalty", 1e-308, "in [0.01, 10]"),
    ("top_k", 2 ** 64, "64-bit"), ("seed", -2 ** 63 - 1, "64-bit"), ("max_tokens", 10 ** 30, "64-bit"),
    ("top_p", 10 ** 400, "64-bit")])
def test_out_of_range_numbers_name_the_field(client, field, value, needle):
    assert_error(client.post("/v1/completions", json=completion(**{field: value})), 400, needle, field)


@pytest.mark.parametrize("raw, needle, param", [
    (b'{"model": "fermium", "prompt": "a", "temperature": NaN}', "finite", "temperature"),
    (b'{"model": "fermium", "prompt": "a", "top_p": Infinity}', "finite", "top_p"),
    (b'{"model": "fermium", "prompt": "a", "min_p": -1e400}', "finite", "min_p"),
    (b'{"model": "fermium", "prompt": "\\ud800"}', "surrogate", "prompt"),
    (b'{"model": "fermium", "prompt": "a", "user": {"x": ["\\udfff"]}}', "surrogate", "user.x[0]"),
    (b'{"model": "fermium", "prompt": "a", "metadata": ' + b"[" * 1000 + b"]" * 1000 + b"}", "nested", None),
    (b'{"model": "fermium", "prompt": "a", "metadata": ' + b"[" * 100 + b"]" * 100 + b"}", "nested", None),
    (b'{"model": "fermium", "prompt": 1' + b"0" * 5000 + b"}", "not valid JSON", None)])
def test_hostile_bodies_are_400(client, raw, needle, param):
    assert_error(client.post("/v1/completions", content=raw), 400, needle, param)


def test_chat_template_kwargs_are_template_variables(client):
    def chat(kwargs):
        return client.post("/v1/chat/completions",
                           json={"model": MODEL, "max_tokens": 2, "chat_template_kwargs": kwargs,
                                 "messages": [{"role": "user", "content": "a"}]})
    assert chat({"self": 1}).status_code == 200
    assert_error(chat({"not a name": 1}), 400, "not a template variable", "chat_template_kwargs.not a name")
    assert_error(chat({"enable_thinking": "no"}), 400, "boolean", "chat_template_kwargs.enable_thinking")
    body = {"model": MODEL, "messages": [{"role": ["user"], "content": "a"}]}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "needs a 'role'")


def test_routes_methods_and_size_answer_in_the_error_shape(client):
    err = assert_error(client.get("/v1/nothing"), 404, "Invalid URL (GET /v1/nothing)")
    assert err["type"] == "invalid_request_error"
    r = client.get("/v1/completions")
    assert_error(r, 405, "Method not allowed") and "POST" in r.headers["allow"]
    assert_error(client.post("/v1/completions", content=b" " * (9 << 20)), 413, "larger than")
