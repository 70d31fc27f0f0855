"""Stacks (router, prefill, decode as processes, fermium.stack) whose routers share one snapshot
store, their metrics, and a steady load of requests over them."""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

from common.model.default import default_model_path
from fermium.stack import Stack, free_port

READY_TIMEOUT_S = 120
EVERY = 64                       # checkpoint interval: the prefill chunk
WAIT_S = 120
KEY = "one deployment's snapshot key"   # the routers of one store share it, or they refuse each other's entries


def stack(tmp: Path, name: str, store: str, extra: list[str] = ()) -> Stack:
    ports = {role: free_port() for role in ("router", "prefill", "decode")}
    logs = tmp / name
    logs.mkdir(exist_ok=True)
    s = Stack(str(default_model_path()), port=free_port(), runner="reference", metrics_ports=ports, log_dir=logs,
              extra={"router": ["--snapshot-every", str(EVERY), "--snapshot-store", store, "--snapshot-key", KEY,
                                *extra]})
    s.metrics_ports = ports
    return s


@contextlib.contextmanager
def routers(tmp: Path, store: str, n: int) -> Iterator[list[Stack]]:
    """`n` stacks, ready, on one store."""
    with contextlib.ExitStack() as stack_of:
        stacks = [stack_of.enter_context(stack(tmp, f"stack{i}", store)) for i in range(n)]
        for s in stacks:
            s.wait_ready(READY_TIMEOUT_S)
        yield stacks


def metric(s: Stack, service: str, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{s.metrics_ports[service]}/metrics", timeout=5).text
    return sum(x.value for f in text_string_to_metric_families(text) for x in f.samples if x.name == name)


def complete(s: Stack | str, prompt, max_tokens: int) -> str:
    url = s if isinstance(s, str) else s.url
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "fermium", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def wait_written(s: Stack) -> None:
    """Until the router's shared-store writer has sent everything it was given."""
    deadline = time.monotonic() + WAIT_S
    while metric(s, "router", "fermium_snapshot_store_queue") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(s, "router", "fermium_snapshot_store_queue") == 0, "the store writer did not drain"


class Load:
    """`clients` threads sending completions round-robin over the stacks until the block ends."""

    def __init__(self, stacks: list[Stack], corpus: list[int], clients: int = 2, max_tokens: int = 4):
        self.stacks, self.corpus, self.max_tokens = stacks, corpus, max_tokens
        self.done, self.failed = 0, []
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.turns = itertools.count()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(WAIT_S)

    def _client(self) -> None:
        while not self.stop.is_set():
            i = next(self.turns)
            # prefixes of one text (hits of many lengths), each with a tail of its own: never whole in RAM
            prompt = self.corpus[:40 + 8 * (i % 12)] + self.corpus[500 + i % 500:503 + i % 500]
            try:
                complete(self.stacks[i % len(self.stacks)], prompt, self.max_tokens)
                with self.lock:
                    self.done += 1
            except Exception as e:                            # noqa: BLE001 - every failure is the finding
                with self.lock:
                    self.failed.append(repr(e))

    def wait_for(self, n: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.done < n and not self.failed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.done >= n or self.failed, f"only {self.done} requests done in {WAIT_S} s"
