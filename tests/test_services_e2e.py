"""The three services as real processes on loopback, driven by the official openai client:
same text as in-process generation (greedy), 8 concurrent streams, /metrics that move."""
from __future__ import annotations

import concurrent.futures as cf
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.generate import generate
from common.reference.model import ReferenceModel
from common.sampling import SamplingParams
from common.snapshots import KV_BLOCK
from common.snapshots.parts import KvParts
from fermium.stack import Stack, free_port
from tests.stack_helpers import CHATML, write_tiny_gguf

READY_TIMEOUT_S = 60        # three Python processes starting on a shared 2-core machine
MAX_TOKENS = 12
STOP_WITHIN_S = 15          # Ctrl-C on `fermium up`: SIGTERM to children, 5 s grace each at most
CANCEL_WITHIN_S = 5         # disconnect -> router Cancel -> decode drops the sequence
PROMPTS = ["the cat", "ROMEO:", "To be, or not", "hello there", "a", "What light", "zz top", "Once upon"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    model = write_tiny_gguf(root / "tiny.gguf")
    ports = {name: free_port() for name in ("router", "prefill", "decode")}
    with Stack(str(model), port=free_port(), runner="reference", metrics_ports=ports, log_dir=root) as s:
        s.wait_ready(READY_TIMEOUT_S)
        s.metrics_ports = ports
        yield s


@pytest.fixture(scope="module")
def local(stack):
    """In-process generation on the same file, with the stack's KV cache type: the expected answers."""
    model = GGUFModel(stack.model)
    tok, reference = Tokenizer.from_gguf(model), ReferenceModel(model, kv_type=DEFAULT_KV_TYPE)

    def expect(prompt_ids: list[int], max_tokens: int = MAX_TOKENS) -> str:
        out = list(generate(reference, prompt_ids, SamplingParams(), max_tokens, tok.eos_ids))
        return tok.decode([t for t in out if t not in tok.eos_ids])
    return tok, expect


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_matches_in_process(client, local):
    tok, expect = local
    want = expect(tok.encode("the cat"))
    r = client.completions.create(model="fermium", prompt="the cat", max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].text == want and len(want) > 0
    assert r.usage.prompt_tokens == len(tok.encode("the cat"))
    assert r.choices[0].finish_reason in ("length", "stop")
    stream = client.completions.create(model="fermium", prompt="the cat", max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == want


def test_chat_matches_in_process(client, local):
    from common.model.chat_template import render_chat
    tok, expect = local
    messages = [{"role": "user", "content": "Who art thou?"}]
    want = expect(tok.encode(render_chat(messages, template=CHATML)))
    r = client.chat.completions.create(model="fermium", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].message.content == want
    stream = client.chat.completions.create(model="fermium", messages=messages, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want


def test_bad_requests_over_the_wire(client, stack):
    with pytest.raises(openai.BadRequestError, match="context limit"):
        client.completions.create(model="fermium", prompt="x" * 600, max_tokens=4)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: frob"):
        client.completions.create(model="fermium", prompt="x", max_tokens=4, extra_body={"frob": 1})
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=b'{"model": "fermium", "messages": [\xff]}')
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]


def test_eight_concurrent_streams(client, local, stack):
    tok, expect = local
    want = {p: expect(tok.encode(p)) for p in PROMPTS}
    before = scrape(stack.metrics_ports["decode"])

    def one(prompt: str) -> str:
        stream = client.completions.create(model="fermium", prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = dict(zip(PROMPTS, pool.map(one, PROMPTS)))
    assert got == want
    after = scrape(stack.metrics_ports["decode"])
    steps = after["fermium_decode_batch_size_count{}"] - before.get("fermium_decode_batch_size_count{}", 0)
    rows = after["fermium_decode_batch_size_sum{}"] - before.get("fermium_decode_batch_size_sum{}", 0)
    assert rows == len(PROMPTS) * (MAX_TOKENS - 1) and steps < rows   # sequences shared decode steps


def test_client_disconnect_cancels_down_to_decode(stack):
    port = stack.metrics_ports["decode"]
    before = scrape(port).get("fermium_decode_requests_total{outcome=cancelled}", 0)
    body = {"model": "fermium", "prompt": "the cat", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
    deadline = time.monotonic() + CANCEL_WITHIN_S
    while scrape(port).get("fermium_decode_requests_total{outcome=cancelled}", 0) == before:
        assert time.monotonic() < deadline, "decode did not drop the abandoned sequence"
        time.sleep(0.1)
    assert stack.health()["running"] == 0


def test_fermium_up_chat_and_ctrl_c(stack):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # started with SIGINT ignored, as a background job of a shell is: Ctrl-C must still stop it
    up = subprocess.Popen([sys.executable, "-m", "fermium", "up", "--model", stack.model, "--port", str(port),
                           "--runner", "reference"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert "Fermium is up at" in up.stdout.readline()       # the banner is the first line
        chat = subprocess.run([sys.executable, "-m", "fermium", "chat", "Hello", "--url", url, "--max-tokens", "6"],
                              capture_output=True, text=True, timeout=READY_TIMEOUT_S)
        assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr[-2000:]
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=STOP_WITHIN_S) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if up.poll() is None:                      # Ctrl-C first: a killed `up` would orphan its services
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                up.kill()


def test_scheduler_joins_between_steps():
    from services.decode.scheduler import BatchScheduler, Sequence
    sched = BatchScheduler(max_batch=2)
    seqs = [Sequence(f"r{i}", None, None, [], 4, frozenset(), False) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert [s.rid for s in sched.admit()] == ["r0", "r1"] and len(sched.waiting) == 1
    sched.retire(seqs[0])
    assert [s.rid for s in sched.admit()] == ["r2"]
    assert sched.cancel("r1") is seqs[1] and sched.cancel("r1") is None
    assert [s.rid for s in sched.running] == ["r2"]


def test_seeded_sampling_is_repeatable(client):
    def sample() -> str:
        return client.completions.create(model="fermium", prompt="the cat", max_tokens=MAX_TOKENS, temperature=1.0,
                                         top_p=0.9, seed=5, extra_body={"top_k": 20}).choices[0].text
    assert sample() == sample()


def scrape(port: int) -> dict[str, float]:
    """{sample name{labels}: value} of one /metrics page, parsed by prometheus-client."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_metrics_move(client, stack, local):
    tok, _ = local
    ports = stack.metrics_ports
    before = {name: scrape(port) for name, port in ports.items()}
    r = client.completions.create(model="fermium", prompt="the cat", max_tokens=5, temperature=0)
    n_prompt, n_gen = len(tok.encode("the cat")), r.usage.completion_tokens
    after = {name: scrape(port) for name, port in ports.items()}

    def delta(service: str, key: str) -> float:
        return after[service].get(key, 0.0) - before[service].get(key, 0.0)

    outcome = r.choices[0].finish_reason
    assert delta("router", f"fermium_requests_total{{outcome={outcome}}}") == 1
    assert delta("router", "fermium_prompt_tokens_total{}") == n_prompt
    assert delta("router", "fermium_generation_tokens_total{}") == n_gen   # greedy never picks EOS here
    for h in ("time_to_first_token", "e2e_request_latency", "request_queue_time", "request_prefill_time",
              "request_decode_time"):
        assert delta("router", f"fermium_{h}_seconds_count{{}}") == 1, h
    assert delta("router", "fermium_inter_token_latency_seconds_count{}") == n_gen - 1
    assert after["router"]["fermium_workers{role=decode}"] == 1
    # a snapshot may cover part or all of the prompt; what it saves, prefill does not run
    assert delta("router", "fermium_snapshot_lookups_total{}") == 1
    saved = delta("router", "fermium_snapshot_tokens_saved_total{}")
    assert delta("prefill", "fermium_prefill_tokens_total{}") == n_prompt - saved
    if saved < n_prompt:                      # a prompt cached whole goes straight to decode
        assert delta("prefill", "fermium_prefill_requests_total{outcome=ok}") == 1
        assert delta("prefill", "fermium_prefill_time_seconds_count{}") == 1
        assert delta("prefill", "fermium_prefill_weight_bytes_total{}") > 0
    assert delta("decode", "fermium_decode_tokens_total{}") == n_gen
    assert delta("decode", f"fermium_decode_requests_total{{outcome={outcome}}}") == 1
    assert delta("decode", "fermium_decode_batch_size_count{}") == n_gen - 1    # the first token comes from prefill
    for service in ("router", "prefill", "decode"):
        assert "fermium_num_requests_running{}" in after[service]


class DictCache:
    """The snapshot seam with an exact-prefix dict behind it (the real store is issue 6's)."""

    wants_final_state = True
    snapshot_every = 0

    def __init__(self, n_lin: int):
        self.entries: dict[tuple[int, ...], tuple[list, object]] = {}
        self.n_lin = n_lin                       # linear-attention layers: the arrays before the KV

    def lookup(self, ids):
        for n in range(len(ids), 0, -1):
            if ids[:n] in self.entries:
                arrays, logits = self.entries[ids[:n]]
                return n, [a.copy() for a in arrays], (logits if n == len(ids) else None)
        return 0, None, None

    def store_state(self, ids, pos, arrays, logits, source, kv_type):
        assert kv_type == DEFAULT_KV_TYPE and arrays[-1].dtype == np.float16     # the workers' cache type
        self.entries[tuple(ids[:pos])] = ([np.array(a) for a in arrays], np.array(logits))

    def held_parts(self, ids, marks=()):
        if tuple(ids) not in self.entries:
            return None
        kv = self.entries[tuple(ids)][0][2 * self.n_lin:]
        return KvParts.cut(len(ids), kv[:len(kv) // 2], kv[len(kv) // 2:], KV_BLOCK)

    def store_parts(self, ids, parts, recurrent, logits, source, kv_type, marks=(), rope_delta=0):
        k, v = parts.arrays()
        self.store_state(ids, parts.pos, [*recurrent, *k, *v], logits, source, kv_type)


def test_snapshot_seam_in_one_process(tmp_path):
    """Router dispatch, prefill and decode servers in this process over loopback: a finished
    sequence's state comes back; a whole-prompt hit skips prefill, a partial hit prefills the rest."""
    import asyncio
    import threading

    from common.metrics import RouterMetrics
    from services.decode.config import DecodeConfig
    from services.decode.server import DecodeServer
    from services.prefill.config import PrefillConfig
    from services.prefill.server import PrefillServer
    from services.router.engine import Engine, Request
    from services.router.engine.admission import Admission
    from services.router.engine.dispatch import Dispatcher

    path = str(write_tiny_gguf(tmp_path / "tiny.gguf"))
    model = GGUFModel(path)
    tok, reference = Tokenizer.from_gguf(model), ReferenceModel(model, kv_type=DEFAULT_KV_TYPE)
    cache = DictCache(len(model.config.linear_layers))
    greedy = SamplingParams(temperature=0.0)

    def expect(ids: list[int], n: int) -> str:
        return tok.decode(list(generate(reference, ids, SamplingParams(), n, tok.eos_ids)))

    async def main() -> tuple[list[str], list[float], tuple[int, ...]]:
        dispatcher = Dispatcher("tcp://127.0.0.1:0", heartbeat_timeout=10, metrics=RouterMetrics(), cache=cache)
        await dispatcher.start()
        servers = [PrefillServer(PrefillConfig(path, router=dispatcher.inbox.address)),
                   DecodeServer(DecodeConfig(path, router=dispatcher.inbox.address, runner="reference"))]
        threads = [threading.Thread(target=lambda s=s: (s.start(), s.serve_forever()), daemon=True) for s in servers]
        for t in threads:
            t.start()
        while dispatcher.registry.count("prefill") + dispatcher.registry.count("decode") < 2:
            await asyncio.sleep(0.05)
        engine = Engine(tok, dispatcher, Admission(4, 4), dispatcher.metrics)
        prompt = tuple(tok.encode("the cat"))
        texts, prefilled = [], []
        texts.append(await run(engine, Request(prompt, 8, greedy)))
        (key,) = cache.entries                                  # prompt + 7 of the 8 tokens, fed
        prefill_tokens = servers[0].metrics.registry.get_sample_value
        for ids in (key, key + tuple(tok.encode("ab"))):
            before = prefill_tokens("fermium_prefill_tokens_total")
            texts.append(await run(engine, Request(ids, 4, greedy)))
            prefilled.append(prefill_tokens("fermium_prefill_tokens_total") - before)
        for s in servers:
            s.stop()
        for t in threads:
            t.join(5)
        for s in servers:
            s.close()
        await dispatcher.close()
        return texts, prefilled, key

    async def run(engine, request) -> str:
        await engine.admit()
        return "".join([d.text async for d in engine.stream(request, time.perf_counter())])

    texts, prefilled, key = asyncio.run(main())
    prompt = tok.encode("the cat")
    assert len(key) == len(prompt) + 7 and texts[0] == expect(prompt, 8)
    assert texts[1] == expect(list(key), 4) and prefilled[0] == 0                     # whole prompt cached
    assert texts[2] == expect([*key, *tok.encode("ab")], 4) and prefilled[1] == len(tok.encode("ab"))
    # runs 2 and 3 sent back only the KV rows past their prompts: the states kept are whole all the same
    finals = [ids for ids in cache.entries if ids != key]
    assert finals and all(ids[:len(key)] == key for ids in finals)
    for ids in finals:
        state = reference.new_state()
        reference.prefill(list(ids), state)
        for kept, want in zip(cache.entries[ids][0], state.arrays()):
            assert kept.shape == want.shape and np.allclose(kept, want, atol=2e-2), ids
