"""Faults: a decode worker killed mid-stream, garbage on every inbox, worker death and
restart in the registry. The stack has two decode workers, so one can die while the other serves."""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import httpx
import openai
import pytest
import zmq

from common.mp import open_socket
from fermium.stack import Stack, free_port
from services.router.engine.workers import WorkerRegistry
from tests.stack_helpers import write_tiny_gguf

READY_TIMEOUT_S = 60
ERROR_WITHIN_S = 10          # the bound: a dead worker's stream ends with an error this fast
LONG = 4000                  # tokens: seconds of decoding on the reference model, so the kill lands mid-stream
CONTEXT = 8192               # (480 tokens took under a second on a fast host, and the stream could end first)
SHORT = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    model = write_tiny_gguf(root / "tiny.gguf", context=CONTEXT)
    ports = {"decode": free_port()}
    with Stack(str(model), port=free_port(), runner="reference", metrics_ports=ports, log_dir=root,
               workers=("prefill", "decode", "decode-b")) as s:
        s.wait_ready(READY_TIMEOUT_S)
        s.metrics_ports = ports
        yield s


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)


def short(client) -> str:
    return client.completions.create(model="fermium", prompt="the cat", max_tokens=SHORT, temperature=0).choices[0].text


def wait_for_workers(stack, role: str, n: int, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while sum(w["role"] == role for w in stack.health()["workers"]) != n:
        assert time.monotonic() < deadline, f"{n} {role} workers not attached within {timeout} s"
        time.sleep(0.1)


def test_garbage_on_every_inbox_is_survived(stack, client):
    addresses = [stack.workers] + [w["address"] for w in stack.health()["workers"]]
    for address in addresses:
        sock = open_socket(zmq.PUSH, address, bind=False)
        for frames in ([b"\x00garbage"], [b"\x81\xa1v\x63"], [b"", b"", b""]):
            sock.send_multipart(frames)
        sock.close()
    time.sleep(0.5)
    assert len(stack.health()["workers"]) == 3
    assert all(p.poll() is None for p in stack.procs.values())
    assert short(client)


def test_killed_decode_worker_ends_its_stream_and_the_rest_goes_on(stack, client):
    started = [threading.Event(), threading.Event()]
    results: dict[int, tuple] = {}

    def stream(i: int) -> None:
        text = ""
        try:
            for chunk in client.completions.create(model="fermium", prompt=f"stream {i}", max_tokens=LONG,
                                                   temperature=0, stream=True):
                text += chunk.choices[0].text if chunk.choices else ""
                started[i].set()
            results[i] = ("ok", text, time.monotonic())
        except openai.APIError as e:
            results[i] = ("error", str(e), time.monotonic())
        finally:
            started[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    assert all(e.wait(30) for e in started)
    inflight = {w["role"] + w["id"]: w["inflight"] for w in stack.health()["workers"] if w["role"] == "decode"}
    assert sorted(inflight.values()) == [1, 1], inflight           # balanced: one stream on each
    stack.procs["decode"].kill()
    killed = time.monotonic()
    for t in threads:
        t.join(60)
    outcomes = sorted(r[0] for r in results.values())
    assert outcomes == ["error", "ok"], results
    error = next(r for r in results.values() if r[0] == "error")
    assert error[2] - killed < ERROR_WITHIN_S and "stopped responding" in error[1]
    assert short(client)                                            # the survivor serves new requests
    wait_for_workers(stack, "decode", 1)

    stack.start("decode")                                           # restarted on a fresh inbox
    wait_for_workers(stack, "decode", 2)
    with cf.ThreadPoolExecutor(4) as pool:   # four at once, so that they overlap even on a busy host
        texts = list(pool.map(lambda _: client.completions.create(
            model="fermium", prompt="the cat", max_tokens=96, temperature=0).choices[0].text, range(4)))
    assert len(set(texts)) == 1
    metrics = httpx.get(f"http://127.0.0.1:{stack.metrics_ports['decode']}/metrics").text
    served = [line for line in metrics.splitlines() if line.startswith("fermium_decode_requests_total{")]
    assert sum(float(line.split()[-1]) for line in served) >= 1, served   # the restarted worker took one


class FakeLink:
    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_registry_death_restart_and_balance():
    now = [0.0]
    reg = WorkerRegistry(timeout=2.0, connect=lambda a: FakeLink(), clock=lambda: now[0])
    reg.register("d1", "decode", "tcp://a:1", 4, "m")
    reg.register("d2", "decode", "tcp://a:2", 4, "m")
    reg.workers["d1"].inflight |= {"r1", "r2"}
    assert reg.pick("decode").worker_id == "d2" and reg.pick("prefill") is None
    now[0] = 1.5
    assert reg.heartbeat("d2", 0, 0) and not reg.heartbeat("nope", 0, 0)
    now[0] = 2.5
    dead = reg.reap()
    assert [w.worker_id for w in dead] == ["d1"] and dead[0].link.closed and dead[0].inflight == {"r1", "r2"}
    replaced = reg.register("d3", "decode", "tcp://a:2", 4, "m")      # d2 restarted at the same address
    assert [w.worker_id for w in replaced] == ["d2"] and list(reg.workers) == ["d3"]
    with pytest.raises(ValueError, match="unknown worker role"):
        reg.register("x", "encode", "tcp://a:3", 1, "m")
