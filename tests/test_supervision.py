"""`fermium up` as a real process under faults, with 4 concurrent streams: kill -9 of decode,
of prefill and of the router (the supervisor restarts each), a worker with the wrong token, and
SIGTERM to `fermium up` itself (it drains). Each test prints its figures as FIGURE lines (run
pytest with -s to see them)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.stack_helpers import write_tiny_gguf
from tests.up_helpers import (
    ERROR_WITHIN_S,
    PROBE,
    RESUME_WITHIN_S,
    Up,
    alive,
    answer,
    ended,
    figure,
    metric,
    start_streams,
    three_free_ports,
    time_to_resume,
)

STREAMS = 4
HEALTH_WITHIN_S = 1.0        # /health says 503 "at once" after a worker dies (its heartbeat timeout is 2.5 s)
ORPHANS_END_WITHIN_S = 5     # sequences decode holds for a dead router are cancelled once it is back
DRAIN_S = 4.0                # --drain-timeout of the SIGTERM test
EXIT_MARGIN_S = 5.0          # issue 27: every child is gone within the drain timeout plus this
CONTEXT = 8192               # room for LONG tokens
LONG_PROMPT = 6000           # characters, about as many tokens: over a second of prefill each
SHORT_IN_DRAIN = 200         # tokens: a stream that ends well within DRAIN_S, which it must be let finish
UNAUTHORIZED = 'fermium_protocol_errors_total{reason="unauthorized",service="router"}'
RUNNING, CANCELLED = "fermium_num_requests_running", 'fermium_decode_requests_total{outcome="cancelled"}'


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("supervision") / "tiny.gguf", context=CONTEXT)


@pytest.fixture(scope="module")
def up(model, tmp_path_factory):
    metrics = three_free_ports()
    u = Up(tmp_path_factory.mktemp("up"), model, metrics_port=metrics)
    u.router_metrics, u.decode_metrics = (f"http://127.0.0.1:{metrics + i}/metrics" for i in (0, 2))
    u.expected = answer(u)
    yield u
    u.close()


def test_kill_decode(up):
    decode_id = next(w["id"] for w in up.health().json()["workers"] if w["role"] == "decode")
    streams = start_streams(up, [f"stream {i}" for i in range(STREAMS)])
    assert all(s.first_token.wait(30) for s in streams) and all(not s.outcome for s in streams)
    pid = up.children()["decode"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while (health := up.health()).status_code != 503:
        assert time.monotonic() - killed < 5, "/health never said 503"
    health_s = time.monotonic() - killed
    refused = httpx.post(f"{up.url}/v1/completions", json={"model": "fermium", **PROBE}, timeout=5.0)
    refused_s = time.monotonic() - killed
    took = ended(streams, killed, "decode")
    resumed = time_to_resume(up, up.expected, killed)
    figure("decode: kill to /health 503", health_s)
    figure("decode: kill to a new request's 503", refused_s)
    figure("decode: kill to serving again", resumed)
    assert health_s < HEALTH_WITHIN_S
    missing = health.json()["missing"]
    assert [(m["role"], m["id"]) for m in missing] == [("decode", decode_id)], missing
    assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
    assert all(s.outcome == "error" and s.done and "stopped responding" in s.error for s in streams), \
        [(s.outcome, s.error) for s in streams]
    assert max(took) < ERROR_WITHIN_S and resumed < RESUME_WITHIN_S
    assert "decode exited with signal SIGKILL" in up.stderr.read_text()


def test_kill_prefill(up):
    rng = random.Random(27)
    prompts = ["".join(rng.choice("abcdefgh ijklmnop") for _ in range(LONG_PROMPT)) for _ in range(STREAMS)]
    streams = start_streams(up, prompts, max_tokens=64)
    deadline = time.monotonic() + 30
    while sum(w["inflight"] for w in up.health().json()["workers"] if w["role"] == "prefill") < STREAMS:
        assert time.monotonic() < deadline, "the prompts never reached prefill"
        time.sleep(0.01)
    pid = up.children()["prefill"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    took = ended(streams, killed, "prefill")
    resumed = time_to_resume(up, up.expected, killed)
    figure("prefill: kill to serving again", resumed)
    # no token came yet, so each fails as an error answer, or as an error event where prefill was done
    assert all((s.outcome == "http 500" or s.outcome == "error" and s.done) and "prefill" in s.error
               for s in streams), [(s.outcome, s.error) for s in streams]
    assert max(took) < ERROR_WITHIN_S and resumed < RESUME_WITHIN_S


def test_kill_router(up):
    cancelled = metric(up.decode_metrics, CANCELLED)
    streams = start_streams(up, [f"router stream {i}" for i in range(STREAMS)])
    assert all(s.first_token.wait(30) for s in streams) and all(not s.outcome for s in streams)
    pid = up.children()["router"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    took = ended(streams, killed, "router")
    resumed = time_to_resume(up, up.expected, killed)
    figure("router: kill to serving again", resumed)
    while metric(up.decode_metrics, RUNNING):      # the dead router's sequences, cancelled
        assert time.monotonic() - killed < resumed + ORPHANS_END_WITHIN_S, "decode still runs the old sequences"
        time.sleep(0.05)
    figure("router: kill to decode holding no sequence of the old router", time.monotonic() - killed)
    assert metric(up.decode_metrics, CANCELLED) - cancelled == STREAMS
    assert all(s.outcome == "dropped" for s in streams), [(s.outcome, s.error) for s in streams]
    assert max(took) < ERROR_WITHIN_S and resumed < RESUME_WITHIN_S


def test_a_worker_with_another_token_is_not_admitted(up, model):
    workers, refused = up.health().json()["workers"], metric(up.router_metrics, UNAUTHORIZED)
    router = next(a for a in Path(f"/proc/{up.children()['router']}/cmdline").read_bytes().decode().split("\0")
                  if a.startswith("tcp://"))
    r = subprocess.run([sys.executable, "-m", "fermium", "decode", "--model", str(model), "--router", router,
                        "--runner", "reference", "--worker-token", "not-the-token", "--ready-timeout", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--worker-token" in r.stderr, r.stderr[-2000:]
    assert up.health().json()["workers"] == workers
    assert metric(up.router_metrics, UNAUTHORIZED) - refused >= 1


def test_sigterm_drains_and_every_child_exits(model, tmp_path):
    up = Up(tmp_path, model, drain=DRAIN_S)
    try:
        kids = up.children()
        assert sorted(kids) == ["decode", "prefill", "router"], kids
        streams = start_streams(up, [f"drain {i}" for i in range(STREAMS - 1)])
        streams += start_streams(up, ["drain short"], max_tokens=SHORT_IN_DRAIN)
        assert all(s.first_token.wait(30) for s in streams) and all(not s.outcome for s in streams)
        sent = time.monotonic()
        up.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = httpx.post(f"{up.url}/v1/completions", json={"model": "fermium", **PROBE}, timeout=5.0)
        took = ended(streams, sent, "sigterm")
        while up.proc.poll() is None or any(map(alive, kids.values())):
            assert time.monotonic() - sent < DRAIN_S + EXIT_MARGIN_S + 5, "children still running"
            time.sleep(0.02)
        gone = time.monotonic() - sent
        figure("sigterm: signal to every child gone", gone)
        assert late.status_code == 503 and late.headers.get("retry-after"), late.text
        outcomes = [(s.outcome, s.done) for s in streams]
        assert outcomes == [("error", True)] * (STREAMS - 1) + [("finished", True)], outcomes
        assert all("drain" in s.error for s in streams[:-1]), [s.error for s in streams]
        assert max(took) <= DRAIN_S + 1 and gone < DRAIN_S + EXIT_MARGIN_S
        assert up.proc.returncode == 0, up.stderr.read_text()[-2000:]
    finally:
        up.close()
