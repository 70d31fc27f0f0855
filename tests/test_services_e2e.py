"""The three services as real processes on loopback, driven by the official openai client:
same text as in-process generation (greedy), 8 concurrent streams, /metrics that move."""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.engine.generate import generate
from common.engine.reference import ReferenceEngine
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.sampling import SamplingParams
from fermium.stack import Stack, free_port
from tests.stack_helpers import CHATML, write_tiny_gguf

READY_TIMEOUT_S = 60        # three Python processes starting on a shared 2-core machine
MAX_TOKENS = 12
PROMPTS = ["the cat", "ROMEO:", "To be, or not", "hello there", "a", "What light", "zz top", "Once upon"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    model = write_tiny_gguf(root / "tiny.gguf")
    ports = {name: free_port() for name in ("router", "prefill", "decode")}
    with Stack(str(model), port=free_port(), engine="reference", metrics_ports=ports, log_dir=root) as s:
        s.wait_ready(READY_TIMEOUT_S)
        s.metrics_ports = ports
        yield s


@pytest.fixture(scope="module")
def local(stack):
    """In-process generation on the same file: the expected answers."""
    model = GGUFModel(stack.model)
    tok, engine = Tokenizer.from_gguf(model), ReferenceEngine(model)

    def expect(prompt_ids: list[int], max_tokens: int = MAX_TOKENS) -> str:
        out = list(generate(engine, prompt_ids, SamplingParams(), max_tokens, tok.eos_ids))
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


def test_eight_concurrent_streams(client, local):
    tok, expect = local
    want = {p: expect(tok.encode(p)) for p in PROMPTS}

    def one(prompt: str) -> str:
        stream = client.completions.create(model="fermium", prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = dict(zip(PROMPTS, pool.map(one, PROMPTS)))
    assert got == want


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
    assert delta("prefill", "fermium_prefill_requests_total{outcome=ok}") == 1
    assert delta("prefill", "fermium_prefill_tokens_total{}") == n_prompt
    assert delta("prefill", "fermium_prefill_time_seconds_count{}") == 1
    assert delta("prefill", "fermium_prefill_weight_bytes_total{}") > 0
    assert delta("decode", "fermium_decode_tokens_total{}") == n_gen
    assert delta("decode", f"fermium_decode_requests_total{{outcome={outcome}}}") == 1
    assert delta("decode", "fermium_decode_batch_size_count{}") == n_gen - 1    # the first token comes from prefill
    for service in ("router", "prefill", "decode"):
        assert "fermium_num_requests_running{}" in after[service]
