"""`n` > 1 choices on the real stack (router, prefill, decode as processes, the demo model, the
official openai client): one prefill for all the copies, choice i sampling with seed + i,
reproducible with a seed, streamed with `index`, usage summed over the choices; and the
dispatcher's copies in one process: where the state goes, and how they fail."""
from __future__ import annotations

import time

import httpx
import numpy as np
import openai
import pytest

from common.kv_cache import DEFAULT_KV_TYPE
from common.metrics import RouterMetrics
from common.model.default import default_model_path
from common.protocol.router import Failed, PrefillDone, Snapshot
from common.sampling import SamplingParams
from fermium.stack import Stack, free_port
from services.router.engine import Request
from services.router.engine.dispatch import Dispatcher
from services.router.engine.prefix_cache import NoPrefixCache
from tests.stack_helpers import metered_demo_stack
from tests.test_services_e2e import scrape

READY_TIMEOUT_S = 60
MAX_TOKENS = 12
CANCEL_WITHIN_S = 5         # disconnect -> router Cancel -> decode drops the sequences
PREFILLED = "fermium_prefill_tokens_total{}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with metered_demo_stack(tmp_path_factory.mktemp("stack"), READY_TIMEOUT_S) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def texts(r) -> list[str]:
    assert [c.index for c in r.choices] == list(range(len(r.choices)))
    return [c.message.content for c in r.choices]


def test_n_with_a_seed_repeats_and_the_choices_differ(client, stack):
    kw = dict(model="fermium", messages=ask("Speak, what news from Mantua?"), max_tokens=MAX_TOKENS,
              temperature=1, seed=7)
    before = scrape(stack.metrics_ports["prefill"])[PREFILLED]
    first = client.chat.completions.create(n=3, **kw)
    prefilled = scrape(stack.metrics_ports["prefill"])[PREFILLED] - before
    assert prefilled == first.usage.prompt_tokens                  # once, not once per choice
    again = client.chat.completions.create(n=3, **kw)              # from the snapshot, prefilling nothing
    assert texts(first) == texts(again) and len(set(texts(first))) > 1
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    assert first.usage.completion_tokens == again.usage.completion_tokens == 3 * MAX_TOKENS
    assert all(c.finish_reason == "length" for c in first.choices)
    # choice i is the request with seed + i
    assert client.chat.completions.create(**{**kw, "seed": 8}).choices[0].message.content == texts(first)[1]


def test_n_streams_each_choice_by_index(client):
    kw = dict(model="fermium", messages=ask("What light through yonder window?"), max_tokens=MAX_TOKENS,
              temperature=1, seed=3, n=3)
    whole = texts(client.chat.completions.create(**kw))
    parts, reasons, usage = ["", "", ""], [None] * 3, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
    assert parts == whole and reasons == ["length"] * 3
    assert usage.completion_tokens == 3 * MAX_TOKENS


def test_greedy_choices_are_alike(client):
    r = client.chat.completions.create(model="fermium", messages=ask("Good morrow."), max_tokens=MAX_TOKENS,
                                       temperature=0, n=2)
    first, second = texts(r)
    assert first == second


def test_completions_take_n(client):
    kw = dict(model="fermium", prompt="ROMEO:", max_tokens=MAX_TOKENS, temperature=1, seed=1)
    r = client.completions.create(n=2, **kw)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 2 * MAX_TOKENS
    assert [c.text for c in r.choices] == [c.text for c in client.completions.create(n=2, **kw).choices]


def test_n_with_a_grammar(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "strict": True, "schema": {
        "type": "object", "required": ["act"], "properties": {"act": {"type": "integer", "minimum": 1, "maximum": 5}},
        "additionalProperties": False}}}
    # thinking off: the demo model would otherwise spend MAX_TOKENS in its think block
    r = client.chat.completions.create(model="fermium", messages=ask("Which act?"), max_tokens=MAX_TOKENS,
                                       temperature=1, seed=2, n=3, response_format=fmt,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert all(c.finish_reason == "stop" and c.message.content.startswith('{"act": ') for c in r.choices)


def test_a_disconnect_cancels_every_copy(stack):
    port, key = stack.metrics_ports["decode"], "fermium_decode_requests_total{outcome=cancelled}"
    before = scrape(port).get(key, 0)
    body = {"model": "fermium", "prompt": "ROMEO:", "max_tokens": 400, "temperature": 1, "n": 3, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=30) as r:
        assert next(r.iter_lines()).startswith("data: {")
    deadline = time.monotonic() + CANCEL_WITHIN_S
    while scrape(port).get(key, 0) < before + 3:
        assert time.monotonic() < deadline, "decode did not drop the abandoned copies"
        time.sleep(0.1)
    assert stack.health()["running"] == 0


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_a_400(stack, n):
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                   json={"model": "fermium", "messages": ask("a"), "max_tokens": 2, "n": n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_copies_without_the_prefix_cache(tmp_path):
    """No snapshot store: the prefill still sends the prompt's end state, for the copies alone."""
    with Stack(str(default_model_path()), port=free_port(), runner="reference", log_dir=tmp_path,
               extra={"router": ["--snapshot-budget", "0"]}) as s:
        s.wait_ready(READY_TIMEOUT_S)
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="fermium", messages=ask("Speak, what news from Mantua?"), max_tokens=MAX_TOKENS,
                  temperature=1, seed=7, n=3)
        first, again = (client.chat.completions.create(**kw) for _ in range(2))
        assert texts(first) == texts(again) and again.usage.prompt_tokens_details.cached_tokens == 0


# ---- the dispatcher's side, in one process
class Recorder:
    def __init__(self):
        self.sent = []

    def put(self, msg) -> None:
        self.sent.append(msg)

    def close(self, wait=None) -> None:
        pass


class WholeHit(NoPrefixCache):
    def lookup(self, ids):
        return len(ids), [np.zeros(2, np.float32)], np.zeros(4, np.float32)


def dispatcher(cache=None):
    d = Dispatcher("inproc://copies", heartbeat_timeout=10, metrics=RouterMetrics(), cache=cache)
    links: dict[str, Recorder] = {}
    d.registry._connect = lambda address: links.setdefault(address, Recorder())
    d.registry.register("p", "prefill", "tcp://p:1", 1, "m")
    d.registry.register("d", "decode", "tcp://d:1", 4, "m")
    job = Request((1, 2, 3), 4, SamplingParams(temperature=1.0, seed=5), n=3)
    return d, links["tcp://p:1"].sent, links["tcp://d:1"].sent, d.submit_copies(job, (9,), 3)


def test_one_prefill_whose_end_state_goes_to_each_copy():
    d, prefills, decodes, tracks = dispatcher()
    (req,) = prefills
    assert req.rid == tracks[0].rid and req.sampling.seed == 5 and req.snapshot_every == 4 and not decodes
    recurrent, logits = [np.ones(2, np.float32)], np.ones(4, np.float32)
    k, v = [np.ones((3, 2, 4), np.float16)], [np.zeros((3, 2, 4), np.float16)]
    d._handle(Snapshot(req.rid, "p", 3, 0, recurrent, k, v, logits, DEFAULT_KV_TYPE))
    assert [(m.rid, m.sampling.seed, m.pos) for m in decodes] == [(t.rid, 5 + i, 3) for i, t in enumerate(tracks)][1:]
    assert all(m.state is decodes[0].state and m.logits is logits for m in decodes)     # assembled once
    assert [a.tolist() for a in decodes[0].state] == [a.tolist() for a in [*recurrent, *k, *v]]


@pytest.mark.parametrize("end", ["failed", "no snapshot"])
def test_the_copies_fail_with_their_prefill(end):
    d, prefills, decodes, tracks = dispatcher()
    rid = prefills[0].rid
    d._handle(Failed(rid, "p", "prefill failed: boom") if end == "failed" else PrefillDone(rid, "p", 3, 0.1))
    for t in tracks[1:]:
        assert isinstance(t.events.get_nowait(), Failed)
    assert not decodes and not d.copies


def test_a_prompt_cached_whole_goes_to_decode_n_times():
    d, prefills, decodes, tracks = dispatcher(WholeHit())
    assert not prefills and [m.sampling.seed for m in decodes] == [5, 6, 7]
    assert [m.rid for m in decodes] == [t.rid for t in tracks] and all(t.cached == 3 for t in tracks)
