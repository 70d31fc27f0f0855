"""Shared by the agent API tests: the real API and Engine in front of a dispatcher that answers
every request with a scripted text (one byte-token at a time), with the Qwen3.6 chat template."""
from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.protocol.router import Finished, Tokens
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.engine.dispatch import Track
from services.router.engine.prefix_cache import NoPrefixCache
from services.router.frontend.api import API
from services.router.frontend.template import chat_renderer
from tests.test_api_errors import ByteTokenizer, lifespan

MODEL = "fermium"
CONTEXT = 1 << 14               # the tool-use system turn alone is long in byte-tokens
CHUNK = 3                       # tokens per Tokens entry: pieces that cut tags apart

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
PARIS_ARGS = '{"city": "Paris", "days": 3}'
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
GEN_THINK = "<|im_start|>assistant\n<think>\n"
GEN_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def call_text(name: str, **params) -> str:
    """One call in Qwen3.6's format."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


class ScriptedDispatcher:
    """A dispatcher whose every answer is `script`, cut at max_tokens; it keeps the jobs it was sent."""

    def __init__(self) -> None:
        self.script = ""
        self.jobs: list = []
        self.tracks: dict[str, Track] = {}
        self.cache = NoPrefixCache()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def submit(self, job, stop_ids) -> Track:
        self.jobs.append(job)
        track = Track(f"r{len(self.jobs)}", job.prompt_ids, "p", "d")
        self.tracks[track.rid] = track
        tokens = list(self.script.encode())
        reason = "length" if len(tokens) >= job.max_tokens else "stop"
        asyncio.get_running_loop().create_task(self._play(track, tokens[:job.max_tokens], reason))
        return track

    async def _play(self, track: Track, tokens: list[int], reason: str) -> None:
        for i in range(0, len(tokens), CHUNK):
            track.events.put_nowait(Tokens(track.rid, tokens[i:i + CHUNK]))
            await asyncio.sleep(0)
        track.events.put_nowait(Finished(track.rid, "d", reason, len(tokens), 0, 0, None, None, None, None, "f32"))

    def cancel(self, rid: str, reason: str) -> None:
        pass

    def forget(self, rid: str) -> None:
        self.tracks.pop(rid, None)

    def prompt(self) -> str:
        """The text of the last prompt."""
        return bytes(self.jobs[-1].prompt_ids).decode()


def make_api(dispatcher: ScriptedDispatcher, preserve_thinking: bool = False, template: str | None = None) -> API:
    tok = ByteTokenizer()
    engine = Engine(tok, dispatcher, Admission(4, 4), RouterMetrics(), 30.0)
    return API(engine, served=(MODEL,), context=CONTEXT, vocab=tok.vocab_size, encode=tok.encode,
               render=chat_renderer(template, preserve_thinking))


@contextlib.contextmanager
def agent_client(**kw):
    dispatcher = ScriptedDispatcher()
    api = make_api(dispatcher, **kw)
    with TestClient(api.app(lifespan=lifespan(dispatcher))) as client:
        client.dispatcher, client.metrics = dispatcher, api.engine.metrics
        yield client


def chat(**kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 500}
    return {**body, **kw}


def post(client, script: str, **kw) -> dict:
    """A non-streamed chat answered with `script`: the whole body."""
    client.dispatcher.script = script
    r = client.post("/v1/chat/completions", json=chat(**kw))
    assert r.status_code == 200, r.text
    return r.json()


def stream(client, script: str, **kw) -> list[dict]:
    """A streamed chat answered with `script`: its chunks, [DONE] checked and left off."""
    client.dispatcher.script = script
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True, **kw)) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def joined(chunks: list[dict], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])


def stream_calls(chunks: list[dict]) -> list[dict]:
    """Tool-call fragments accumulated the way OpenAI's clients do, checking the fragments' shape."""
    calls: dict[int, dict] = {}
    for c in chunks:
        for frag in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            if frag["index"] not in calls:
                assert set(frag) == {"index", "id", "type", "function"} and frag["function"]["name"]
                calls[frag["index"]] = {"id": frag["id"], "name": frag["function"]["name"],
                                        "arguments": frag["function"]["arguments"]}
            else:
                assert set(frag) == {"index", "function"} and set(frag["function"]) == {"arguments"}
                calls[frag["index"]]["arguments"] += frag["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]
