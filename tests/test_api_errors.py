"""The HTTP API in one process (LocalDispatcher: the real router, prefill and decode servers on
threads; a counting runner, a byte tokenizer): bad requests get a 4xx with a clear OpenAI-style
body; good ones stream and finish right."""
from __future__ import annotations

import codecs
import contextlib
import json

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.model.config import ModelConfig
from common.state import SequenceState
from fermium.local import LocalDispatcher
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.engine.dispatch import Dispatcher, Track
from services.router.frontend.api import API
from tests.conftest import Metadata

CONTEXT = 64
EOS = 256
MODEL = "fermium"


class ByteTokenizer:
    """One token per byte, plus EOS."""

    vocab_size = 257
    eos_ids = {EOS}

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == EOS else bytes([token_id])

    def stream(self):
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

        class Stream:
            def push(self, t: int) -> str:
                return dec.decode(bytes([t]))

            def finish(self) -> str:
                return dec.decode(b"", final=True)
        return Stream()


def counting_config(context: int = 4096) -> ModelConfig:
    """A model with no layers: its state is only a position, which the servers check all the same."""
    arch = "qwen35moe"
    fields = {"embedding_length": 8, "block_count": 0, "context_length": context, "attention.head_count": 1,
              "attention.head_count_kv": 1, "attention.layer_norm_rms_epsilon": 1e-6, "ssm.conv_kernel": 2,
              "ssm.group_count": 1, "ssm.state_size": 1, "ssm.time_step_rank": 1, "ssm.inner_size": 1,
              "expert_count": 1, "expert_used_count": 1, "expert_feed_forward_length": 1}
    meta = Metadata(**{"general.architecture": arch}, **{f"{arch}.{k}": v for k, v in fields.items()})
    return ModelConfig.from_gguf_fields(meta.get, meta.has, "counting", ByteTokenizer.vocab_size)


class CountingRunner:
    """Greedy output after byte b is b + 1; after 'z' comes EOS."""

    cfg = counting_config()

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.cfg)

    def _logits(self, last: int) -> np.ndarray:
        out = np.zeros(ByteTokenizer.vocab_size, np.float32)
        out[EOS if last == ord("z") else (last + 1) % 256] = 1.0
        return out

    def prefill(self, tokens, state):
        state.pos += len(tokens)
        return self._logits(tokens[-1])

    def decode(self, tokens, states):
        for s in states:
            s.pos += 1
        return np.stack([self._logits(t) for t in tokens])


def lifespan(dispatcher):
    """The router's own: the dispatcher starts and stops with the app."""
    @contextlib.asynccontextmanager
    async def span(app):
        await dispatcher.start()
        yield
        await dispatcher.close()
    return span


def make_app(dispatcher, max_running: int = 4, max_queue: int = 4, request_timeout: float = 30.0) -> Starlette:
    tok = ByteTokenizer()
    engine = Engine(tok, dispatcher, Admission(max_running, max_queue), RouterMetrics(), request_timeout)
    api = API(engine, served=(MODEL,), context=CONTEXT, vocab=tok.vocab_size, encode=tok.encode,
              render=lambda msgs, kw: "".join(f"{m['role']}:{m['content']}\n" for m in msgs))
    return api.app(lifespan=lifespan(dispatcher))


@pytest.fixture(scope="module")
def client():
    with TestClient(make_app(LocalDispatcher(CountingRunner()))) as c:
        yield c


def completion(**kw) -> dict:
    return {"model": MODEL, "prompt": "a", "max_tokens": 3, "temperature": 0, **kw}


def assert_error(r, status: int, needle: str, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"]
    assert err["type"] and set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param
    return err


# ---- bad requests

def test_invalid_json(client):
    r = client.post("/v1/completions", content=b'{"model": "fermium", "prompt": ',
                    headers={"content-type": "application/json"})
    assert_error(r, 400, "not valid JSON")


def test_invalid_utf8(client):
    r = client.post("/v1/completions", content=b'{"model": "fermium", "prompt": "\xff\xfe"}')
    assert_error(r, 400, "not valid UTF-8")


def test_unknown_model(client):
    err = assert_error(client.post("/v1/completions", json=completion(model="gpt-4")), 404, "`gpt-4` does not exist")
    assert err["code"] == "model_not_found"


@pytest.mark.parametrize("value", [-1, 0])
def test_nonpositive_max_tokens(client, value):
    assert_error(client.post("/v1/completions", json=completion(max_tokens=value)), 400, ">= 1", "max_tokens")


def test_prompt_over_context(client):
    err = assert_error(client.post("/v1/completions", json=completion(prompt="x" * (CONTEXT + 1))), 400,
                       f"context limit is {CONTEXT}")
    assert err["code"] == "context_length_exceeded"
    r = client.post("/v1/completions", json=completion(prompt="x" * 10, max_tokens=CONTEXT))
    assert_error(r, 400, "exceeds this model's context limit", "max_tokens")


def test_unknown_field(client):
    assert_error(client.post("/v1/completions", json=completion(frobnicate=1)), 400,
                 "Unrecognized request argument supplied: frobnicate", "frobnicate")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "prompt": "a"}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "Unrecognized request argument supplied: prompt")


@pytest.mark.parametrize("field, value, needle", [
    ("n", 17, "in [1, 16]"), ("temperature", -0.5, "0 (greedy) or in [0.001, 2]"), ("top_p", 0, "in (0, 1]"),
    ("logprobs", 21, "in [0, 20]"), ("presence_penalty", 2.5, "in [-2, 2]"),
    ("stop", ["a", "b", "c", "d", "e"], "at most 4"), ("seed", "x", "integer")])
def test_bad_values(client, field, value, needle):
    assert_error(client.post("/v1/completions", json=completion(**{field: value})), 400, needle, field)


@pytest.mark.parametrize("field, value, needle", [
    ("logit_bias", {"42": 101}, "in [-100, 100]"), ("logit_bias", {"99999999": 1}, "not a token id"),
    ("top_logprobs", 21, "in [0, 20]"), ("top_logprobs", 2, "needs 'logprobs'"), ("logprobs", 3, "boolean")])
def test_unhonoured_chat_fields(client, field, value, needle):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 2, field: value}
    assert_error(client.post("/v1/chat/completions", json=body), 400, needle, field)


def test_plain_text_format_and_empty_bias_are_accepted(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
            "response_format": {"type": "text"}, "logit_bias": {}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_bad_messages(client):
    body = {"model": MODEL, "messages": [{"role": "wizard", "content": "a"}]}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "needs a 'role'")


def test_queue_full_is_429_with_retry_after():
    with TestClient(make_app(LocalDispatcher(CountingRunner()), max_running=0, max_queue=0)) as c:
        r = c.post("/v1/completions", json=completion())
    assert_error(r, 429, "at capacity")
    assert r.headers["retry-after"] == "1"


def test_no_workers_is_503():
    dispatcher = Dispatcher("inproc://unused", heartbeat_timeout=1.0, metrics=RouterMetrics())
    with TestClient(make_app(dispatcher)) as c:
        r = c.post("/v1/completions", json=completion())
    assert_error(r, 503, "no prefill worker is connected")
    assert "retry-after" in r.headers


class SilentDispatcher(LocalDispatcher):
    """Accepts requests and never answers: a lost message somewhere between the workers."""

    def submit(self, job, stop_ids):
        track = Track("silent", job.prompt_ids, "p", "d")
        self.tracks[track.rid] = track
        return track


def test_a_request_nobody_answers_ends_with_an_error():
    with TestClient(make_app(SilentDispatcher(CountingRunner()), request_timeout=0.3)) as c:
        r = c.post("/v1/completions", json=completion())
        assert_error(r, 500, "no reply from the workers")
        assert c.get("/health").json()["status"] == "ok"


# ---- good requests

def test_documented_fields_are_accepted(client):
    body = {"model": MODEL, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}]}], "max_tokens": 2, "temperature": 0, "stream_options": None,
        "user": "u1", "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False, "n": 1,
        "metadata": {"k": "v"}, "seed": 7, "top_k": 5, "response_format": {"type": "text"}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "\x0b\x0c"   # after "user:a\n" comes 0x0b


def test_completion_length(client):
    r = client.post("/v1/completions", json=completion(prompt="a", max_tokens=3)).json()
    assert r["choices"][0]["text"] == "bcd" and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4,
                          "prompt_tokens_details": {"cached_tokens": 0}}


def test_completion_eos_and_stop_string(client):
    r = client.post("/v1/completions", json=completion(prompt="w", max_tokens=10)).json()
    assert r["choices"][0]["text"] == "xyz" and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == 4            # the EOS token counts, as in vLLM
    r = client.post("/v1/completions", json=completion(prompt="a", max_tokens=10, stop=["ef", "q"])).json()
    assert r["choices"][0]["text"] == "bcd" and r["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_ends_with_done(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "v"}], "stream": True, "max_tokens": 30,
            "temperature": 0, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "".join(map(chr, range(0x0b, 0x0b + 30)))     # counting up from "\n" + 1
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30


def test_models_and_health(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("stream", [False, True])
def test_a_run_that_ends_on_its_first_token_frees_its_slot(stream):
    with TestClient(make_app(LocalDispatcher(CountingRunner()), max_running=1, max_queue=0)) as c:
        for _ in range(3):                                  # a leaked slot would make the next one a 429
            r = c.post("/v1/completions", json=completion(prompt="z", stream=stream))
            assert r.status_code == 200, r.text
            if not stream:
                assert r.json()["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}


def test_queued_tokens_join_into_one_chunk():
    import asyncio

    from common.protocol.router import Finished, Tokens
    from services.router.engine.generation import _coalesce

    q: asyncio.Queue = asyncio.Queue()
    for item in (Tokens("r", [2]), Tokens("r", [3, 4]),
                 Finished("r", "w", "length", 4, 9, 0, None, None, None, None, "f16")):
        q.put_nowait(item)
    merged = _coalesce(Tokens("r", [1]), q)
    assert merged.tokens == [1, 2, 3, 4] and isinstance(q.get_nowait(), Finished)
    done = Finished("r", "w", "stop", 1, 1, 0, None, None, None, None, "f16")
    assert _coalesce(done, q) is done


class BrokenDispatcher(LocalDispatcher):
    """A submit that raises what msgpack raised on an integer past int64."""

    def submit(self, job, stop_ids):
        raise OverflowError("int too big to convert")


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_submit_gives_its_slot_back(stream):
    app = make_app(BrokenDispatcher(CountingRunner()), max_running=2, max_queue=0)
    with TestClient(app) as c:
        for _ in range(64):                       # a leaked slot would make these 429 from the third on
            assert_error(c.post("/v1/completions", json=completion(stream=stream)), 500, "could not be dispatched")
        assert c.get("/health").json()["status"] == "ok"
