"""Placement through real processes on the demo model: the later turns of a conversation land on
the prefill worker that holds its state, which the router names instead of sending (0 state bytes
on the wire, only the new tokens prefilled, the cold run's text); a state the worker no longer
holds is sent again and the request succeeds with the same text; decode sequences go to the
worker with free batch slots."""
from __future__ import annotations

import math
import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.default import default_model_path
from common.state import state_specs
from fermium.stack import Stack, free_port
from tests.stack_helpers import DemoReference

READY_TIMEOUT_S = 120            # four or five Python processes starting on a shared 2-core machine
WAIT_S = 30
EVERY = 64                       # checkpoint interval: the prefill chunk
MAX_TOKENS = 8
NEW = 10                         # the tokens each later turn adds
SENT = "fermium_state_bytes_sent_total"
PREFILLED = "fermium_prefill_tokens_total"
FROM_DECODE = ("fermium_prefill_state_bytes_received_total", {"source": "decode"})


@pytest.fixture(scope="module")
def demo():
    ref = DemoReference()
    return ref.config, lambda ids: ref.cold(ids, MAX_TOKENS), ref.text, ref.corpus


def make_stack(tmp, workers: tuple[str, ...], extra: dict[str, list[str]] | None = None) -> Stack:
    ports = {name: free_port() for name in ("router", *workers)}
    extra = dict(extra or {})
    extra["router"] = ["--snapshot-every", str(EVERY), *extra.get("router", [])]
    s = Stack(str(default_model_path()), port=free_port(), runner="reference", metrics_ports=ports, log_dir=tmp,
              workers=workers, extra=extra)
    s.metrics_ports = ports
    return s


def metric(s: Stack, service: str, name: str, labels: dict | None = None) -> float:
    text = httpx.get(f"http://127.0.0.1:{s.metrics_ports[service]}/metrics", timeout=5).text
    return sum(x.value for f in text_string_to_metric_families(text) for x in f.samples
               if x.name == name and all(x.labels.get(k) == v for k, v in (labels or {}).items()))


def complete(s: Stack, prompt: list[int]) -> str:
    r = httpx.post(f"{s.url}/v1/completions", timeout=120, json={
        "model": "fermium", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def wait_until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S} s"
        time.sleep(0.02)


def busy_prefill(s: Stack) -> str | None:
    """The address of a prefill worker with a request in flight."""
    return next((w["address"] for w in s.health()["workers"] if w["role"] == "prefill" and w["inflight"]), None)


def registered(s: Stack) -> int:
    try:
        return len(s.health().get("workers", ()))
    except httpx.HTTPError:                  # the router is still starting
        return 0


class Deltas:
    """Metrics before a request, and their change after it."""

    def __init__(self, s: Stack, names: dict[str, tuple]):
        self.s, self.names = s, names
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        return {k: metric(self.s, *where) for k, where in self.names.items()}

    def __call__(self) -> dict[str, float]:
        return {k: v - self.before[k] for k, v in self._now().items()}


def state_size(cfg, pos: int) -> int:
    return sum(math.prod(shape) * np.dtype(dtype).itemsize for _, dtype, shape in state_specs(pos, cfg,
                                                                                             DEFAULT_KV_TYPE))


def test_later_turns_land_on_the_holder_and_carry_no_state(tmp_path, demo):
    cfg, cold, text, corpus = demo
    workers = ("prefill", "prefill-b")
    inbox = {w: f"tcp://127.0.0.1:{free_port()}" for w in workers}
    extra = {"router": ["--heartbeat-timeout", "120"], **{w: ["--listen", inbox[w]] for w in workers}}
    with make_stack(tmp_path, (*workers, "decode"), extra) as s:
        s.wait_ready(READY_TIMEOUT_S)
        prompts = {"long": corpus[:600], "short": corpus[650:800]}
        seen = {w: metric(s, w, PREFILLED) for w in workers}
        # turn 1 of both while the first one's worker is busy (stopped): the second goes to the other worker,
        # which by load alone would not win its later turns' ties
        try:
            for w in workers:
                os.kill(s.procs[w].pid, signal.SIGSTOP)
            texts = {}
            long_turn = threading.Thread(target=lambda: texts.setdefault("long", complete(s, prompts["long"])))
            long_turn.start()
            wait_until(lambda: busy_prefill(s), "the long prompt reached a prefill worker")
            first = next(w for w in workers if inbox[w] == busy_prefill(s))
            os.kill(s.procs[next(w for w in workers if w != first)].pid, signal.SIGCONT)
            assert complete(s, prompts["short"]) == text(cold(prompts["short"]))
        finally:
            for w in workers:
                os.kill(s.procs[w].pid, signal.SIGCONT)
        long_turn.join(WAIT_S * 4)
        assert texts["long"] == text(cold(prompts["long"]))
        ran = {w: metric(s, w, PREFILLED) - seen[w] for w in workers}
        assert sorted(ran.values()) == sorted(map(len, prompts.values())), ran      # one prompt on each worker
        holder = {name: next(w for w in workers if ran[w] == len(p)) for name, p in prompts.items()}
        for turn in (2, 3):
            for n, (name, prompt) in enumerate(prompts.items()):
                h = holder[name]
                wait_until(lambda: metric(s, h, *FROM_DECODE) > 0, f"{h} received the final state")
                generated = cold(prompt)
                offset = 800 + 80 * (turn - 2) + 40 * n
                prompt = prompts[name] = prompt + generated[:-1] + corpus[offset:offset + NEW]
                names = {"sent": ("router", SENT, {"role": "prefill"}),
                         "skipped": ("router", "fermium_state_transfers_skipped_total"),
                         "hits": (h, "fermium_prefill_held_lookups_total", {"outcome": "hit"}),
                         "from_decode": (h, *FROM_DECODE),
                         **{w: (w, PREFILLED) for w in workers}}
                delta = Deltas(s, names)
                assert complete(s, prompt) == text(cold(prompt))
                wait_until(lambda: delta()["from_decode"] > 0, f"{h} received turn {turn}'s final state")
                got = delta()
                assert got["sent"] == 0 and got["skipped"] == 1 and got["hits"] == 1, got
                assert got[h] == NEW and all(got[w] == 0 for w in workers if w != h), got
        assert metric(s, "router", "fermium_state_bytes_skipped_total") > 0
        assert metric(s, "router", "fermium_state_resends_total") == 0


def test_a_state_the_worker_no_longer_holds_is_sent_again(tmp_path, demo):
    cfg, cold, text, corpus = demo
    a, b = corpus[:150], corpus[500:560]          # B's states are smaller than A's: each one evicts A's
    longest = len(a) + MAX_TOKENS + NEW
    budget = (state_size(cfg, longest) + 1) / 2 ** 30      # one state at a time: B's turn 1 evicts A's
    with make_stack(tmp_path, ("prefill", "decode"), {"prefill": ["--held-budget", repr(budget)]}) as s:
        s.wait_ready(READY_TIMEOUT_S)
        for n, prompt in enumerate((a, b)):
            assert complete(s, prompt) == text(cold(prompt))
            wait_until(lambda: metric(s, "prefill", *FROM_DECODE) >= n + 1, "prefill received the final state")
        assert metric(s, "prefill", "fermium_prefill_held_states") == 1
        generated = cold(a)
        turn2 = a + generated[:-1] + corpus[900:900 + NEW]
        delta = Deltas(s, {"sent": ("router", SENT, {"role": "prefill"}),
                           "resends": ("router", "fermium_state_resends_total"),
                           "misses": ("prefill", "fermium_prefill_held_lookups_total", {"outcome": "miss"}),
                           "received": ("prefill", "fermium_prefill_state_bytes_received_total", {"source": "router"}),
                           "prefilled": ("prefill", PREFILLED),
                           "failed": ("router", "fermium_requests_total", {"outcome": "error"})})
        assert complete(s, turn2) == text(cold(turn2))
        got = delta()
        resent = state_size(cfg, len(a) + len(generated) - 1)
        assert got["resends"] == 1 and got["misses"] == 1 and got["failed"] == 0, got
        assert got["sent"] == resent and got["received"] == resent, got
        assert got["prefilled"] == NEW, got


def test_decode_goes_to_the_worker_with_free_batch_slots(tmp_path, demo):
    _, cold, text, corpus = demo
    s = make_stack(tmp_path, ("prefill", "decode", "decode-b"),
                   {"decode": ["--max-batch", "1"], "decode-b": ["--max-batch", "4"]})
    try:
        for name in ("router", "prefill", "decode"):      # decode first: by load alone it would win the ties
            s.start(name)
        wait_until(lambda: registered(s) == 2, "prefill and decode registered")
        s.start("decode-b")
        s.wait_ready(READY_TIMEOUT_S)
        delta = Deltas(s, {w: (w, "fermium_decode_tokens_total") for w in ("decode", "decode-b")})
        for i in range(3):
            prompt = corpus[100 * i:100 * i + 40]
            assert complete(s, prompt) == text(cold(prompt))
        got = delta()
        assert got["decode"] == 0 and got["decode-b"] > 0, got
    finally:
        s.stop()
