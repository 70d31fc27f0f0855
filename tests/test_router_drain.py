"""SIGTERM to a real router process under 4 concurrent streams: it drains. New requests get 503
and /health says "draining"; the streams finish, or end with an error event and [DONE] when the
drain time runs out; the router is gone within the drain time plus EXIT_MARGIN_S."""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import threading
import time
from pathlib import Path

import httpx

from fermium.stack import Stack, free_port
from tests.stack_helpers import write_tiny_gguf

READY_TIMEOUT_S = 60
DRAIN_S = 3.0
LONG_DRAIN_S = 10.0             # for streams that finish: ample, so the test also shows no wait past them
EXIT_MARGIN_S = 5.0
STREAMS = 4
CONTEXT = 4096
LONG, SHORT = 4000, 300         # tokens: far past the drain time, and well within it


def _stream(url: str, max_tokens: int, started: threading.Barrier) -> tuple[list[str], float]:
    """The stream's data lines, and when it ended (monotonic)."""
    body = {"model": "fermium", "prompt": "the cat", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 1:
                    started.wait()
    return events, time.monotonic()


def _drain(tmp_path: Path, max_tokens: int, drain_s: float = DRAIN_S):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", context=CONTEXT)
    with Stack(str(model), port=free_port(), runner="reference", log_dir=tmp_path, drain_timeout=drain_s) as s:
        s.wait_ready(READY_TIMEOUT_S)
        started = threading.Barrier(STREAMS + 1, timeout=30)
        with cf.ThreadPoolExecutor(STREAMS) as pool:
            streams = [pool.submit(_stream, s.url, max_tokens, started) for _ in range(STREAMS)]
            started.wait()                                  # every stream has its first chunk
            router = s.procs["router"]
            t0 = time.monotonic()
            router.send_signal(signal.SIGTERM)
            refused = _probe_while_draining(s.url, router)
            ends = [f.result() for f in streams]
        code = router.wait(timeout=drain_s + EXIT_MARGIN_S)
        exited = time.monotonic() - t0
    return ends, refused, code, exited, t0


def _probe_while_draining(url: str, router) -> list[tuple[int, int, dict, dict]]:
    """(status of a new completion, of /health, their bodies) while the router still answers."""
    out = []
    time.sleep(0.2)
    with httpx.Client(base_url=url, timeout=5) as c:
        while router.poll() is None and len(out) < 3:
            try:
                r = c.post("/v1/completions", json={"model": "fermium", "prompt": "a", "max_tokens": 2})
                h = c.get("/health")
            except httpx.TransportError:
                break                                       # the drain ended, and with it the socket
            out.append((r.status_code, h.status_code, r.json() | {"retry": r.headers.get("retry-after")}, h.json()))
            time.sleep(0.3)
    return out


def _check_refusals(refused) -> None:
    for status, health, body, info in refused:
        assert status == 503 and body["error"]["code"] == "shutting_down" and body["retry"], body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert health == 503 and info["status"] == "draining"


def test_drain_time_runs_out(tmp_path):
    ends, refused, code, exited, t0 = _drain(tmp_path, LONG)
    print(f"\ndrain, {STREAMS} streams of {LONG} tokens: {len(refused)} requests refused with 503 meanwhile; "
          f"streams ended {max(t for _, t in ends) - t0:.2f} s after SIGTERM, the router exited after {exited:.2f} s")
    assert len(refused) >= 2
    _check_refusals(refused)
    for events, ended in ends:
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "shutting_down" and "drain time" in err["message"]
        assert ended - t0 <= DRAIN_S + 1.5                  # the drain time, and the ended streams' last bytes
    assert code == 0 and exited <= DRAIN_S + EXIT_MARGIN_S


def test_streams_finish_within_the_drain(tmp_path):
    ends, refused, code, exited, t0 = _drain(tmp_path, SHORT, LONG_DRAIN_S)
    print(f"\ndrain, {STREAMS} streams of {SHORT} tokens: {len(refused)} requests refused with 503 meanwhile; "
          f"all finished {max(t for _, t in ends) - t0:.2f} s "
          f"after SIGTERM, the router exited after {exited:.2f} s")
    _check_refusals(refused)
    for events, ended in ends:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    last = max(t for _, t in ends) - t0
    assert code == 0 and exited < min(last + EXIT_MARGIN_S, LONG_DRAIN_S)
