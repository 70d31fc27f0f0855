"""A stuck compute loop under `fermium up`, with real processes: decode's and then prefill's loop
hangs on purpose (common.liveness.HANG_ENV) while its heartbeat thread lives. /health says 503
naming it within --stall-timeout + 2 s, its in-flight requests end at once with a retryable error
(the stream's error event, a plain request's 503 with Retry-After), and the supervisor's restart
serves again. Figures (run pytest with -s): hang to 503, to the old process's exit, to serving."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from common.liveness import EXIT_STALLED, HANG_ENV
from tests.stack_helpers import write_tiny_gguf
from tests.up_helpers import LONG, RESUME_WITHIN_S, Up, alive, answer, figure, start_streams, time_to_resume

STALL_S = 3.0                # --stall-timeout of the test's stack
REPORTED_WITHIN_S = STALL_S + 2.0       # the bound, from the hang to /health's 503
FAIL_WITHIN_S = REPORTED_WITHIN_S + 1.0  # the in-flight requests end with the report (one poll of margin)
CONTEXT = 8192


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    root = tmp_path_factory.mktemp("stall")
    model = write_tiny_gguf(root / "tiny.gguf", context=CONTEXT)
    u = Up(root, model, extra=("--stall-timeout", str(STALL_S)), env={HANG_ENV: str(root / "hang")})
    u.hang_file, u.expected = root / "hang", answer(u)
    yield u
    u.close()


class Plain(threading.Thread):
    """One non-streaming completion; records its status, Retry-After and when it ended."""

    def __init__(self, url: str, max_tokens: int, prompt: str):
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.prompt = url, max_tokens, prompt
        self.status, self.retry_after, self.code, self.ended_at = 0, None, None, 0.0

    def run(self) -> None:
        r = httpx.post(f"{self.url}/v1/completions", timeout=60.0,
                       json={"model": "fermium", "prompt": self.prompt, "max_tokens": self.max_tokens})
        self.ended_at = time.monotonic()
        self.status, self.retry_after = r.status_code, r.headers.get("retry-after")
        self.code = r.json().get("error", {}).get("code") if r.status_code != 200 else None


def hang(up: Up, role: str) -> float:
    """Arm the hook for `role`; returns the monotonic time its loop hung (after a request reaches it)."""
    up.hang_file.write_text(role)
    hung = Path(f"{up.hang_file}.hung")
    deadline = time.monotonic() + 30
    while not hung.exists() or not hung.read_text():
        assert time.monotonic() < deadline, f"{role} never took a request to hang on"
        time.sleep(0.02)
    at = float(hung.read_text())
    hung.unlink()
    return time.monotonic() - (time.time() - at)


def reported(up: Up, role: str, since: float) -> tuple[float, dict]:
    """Seconds from `since` until /health says 503 naming a stalled worker of `role`, and /health."""
    while True:
        r = up.health()
        stalled = r.json().get("stalled", []) if r.status_code == 503 else []
        if any(s["role"] == role for s in stalled):
            return time.monotonic() - since, r.json()
        assert time.monotonic() - since < REPORTED_WITHIN_S + 10, f"/health never named the stalled {role}"
        time.sleep(0.05)


def restarted(up: Up, role: str, old_pid: int, since: float) -> float:
    deadline = since + REPORTED_WITHIN_S + RESUME_WITHIN_S
    while alive(old_pid) or up.children().get(role, old_pid) == old_pid:
        assert time.monotonic() < deadline, f"{role} was not restarted: {up.stderr.read_text()[-3000:]}"
        time.sleep(0.05)
    return time.monotonic() - since


def test_a_stuck_decode_loop_is_reported_its_requests_fail_fast_and_it_is_restarted(up):
    old = up.children()["decode"]
    streams = start_streams(up, [f"stream {i}" for i in range(2)], LONG)
    assert all(s.first_token.wait(30) for s in streams)
    plain = Plain(up.url, LONG, "a plain one")
    plain.start()
    hung = hang(up, "decode")                 # the next request decode takes hangs its loop
    probe = Plain(up.url, 4, "a probe")
    probe.start()
    health_s, health = reported(up, "decode", hung)
    for s in streams:
        s.join(FAIL_WITHIN_S + 5)
    plain.join(FAIL_WITHIN_S + 5)
    ended = [round(t.ended_at - hung, 3) for t in (*streams, plain)]
    exit_s = restarted(up, "decode", old, hung)
    resumed = time_to_resume(up, up.expected, hung)
    figure("decode hang to /health 503", health_s)
    figure("decode hang to its requests' ends", f"{ended} s")
    figure("decode hang to its restart", exit_s)
    figure("decode hang to serving again", resumed)
    assert health_s < REPORTED_WITHIN_S
    assert health["status"] == "degraded" and health["stalled"][0]["reason"]
    assert [s.outcome for s in streams] == ["error", "error"]
    assert all("stalled" in s.error and "tcp://" not in s.error for s in streams)
    assert (plain.status, plain.code) == (503, "worker_stalled") and plain.retry_after
    assert max(ended) < FAIL_WITHIN_S
    assert f"code {EXIT_STALLED}" in up.stderr.read_text()      # the supervisor saw it exit on its own
    probe.join(30)
    assert probe.status in (200, 503)                         # never a wait for --request-timeout
    figure("decode hang to /health 200 again", healthy(up, hung))


def healthy(up: Up, since: float) -> float:
    """Seconds from `since` until /health says 200 again: the stalled entry goes once the old
    process has been silent for the router's --heartbeat-timeout."""
    while up.health().status_code != 200:
        assert time.monotonic() - since < REPORTED_WITHIN_S + RESUME_WITHIN_S, up.health().json()
        time.sleep(0.05)
    return time.monotonic() - since


def test_a_stuck_prefill_loop_is_reported_and_restarted(up):
    old = up.children()["prefill"]
    plain = Plain(up.url, 4, "a prompt no cache holds")   # a cached prompt would not reach prefill
    up.hang_file.write_text("prefill")
    plain.start()
    hung = hang(up, "prefill")
    health_s, _ = reported(up, "prefill", hung)
    plain.join(FAIL_WITHIN_S + 5)
    exit_s = restarted(up, "prefill", old, hung)
    resumed = time_to_resume(up, up.expected, hung)
    figure("prefill hang to /health 503", health_s)
    figure("prefill hang to its request's 503", plain.ended_at - hung)
    figure("prefill hang to its restart", exit_s)
    figure("prefill hang to serving again", resumed)
    assert health_s < REPORTED_WITHIN_S
    assert (plain.status, plain.code) == (503, "worker_stalled") and plain.retry_after
    assert plain.ended_at - hung < FAIL_WITHIN_S
    figure("prefill hang to /health 200 again", healthy(up, hung))
