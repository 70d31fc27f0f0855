"""Shared by the tests of `fermium up` under faults: `fermium up` as a real process with its
children found in /proc, streaming clients that record how and when they ended, and figures."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from fermium.stack import free_port

READY_TIMEOUT_S = 60
ERROR_WITHIN_S = 10          # issue 27: the in-flight requests of a killed process end with an error this fast
RESUME_WITHIN_S = 15         # and serving resumes on its own this fast
LONG = 8000                  # tokens: many seconds of decoding on the reference model, so a kill lands mid-stream
PROBE = dict(prompt="the cat", max_tokens=16, temperature=0)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log=lambda: "", name: str = "the server",
                 interval: float = 0.1, path: str = "/health") -> None:
    """Until `url``path` answers 200; fails with log() when proc exits first or timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{name} exited: {log()}"
        try:
            if httpx.get(f"{url}{path}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{name} not serving within {timeout} s: {log()}"
        time.sleep(interval)


def figure(name: str, value: float | str) -> None:
    print(f"FIGURE {name}: {value:.3f} s" if isinstance(value, float) else f"FIGURE {name}: {value}", flush=True)


class Up:
    """`python -m fermium up` in a session of its own; its children are found in /proc."""

    def __init__(self, root: Path, model: Path, *, drain: float = 30.0, metrics_port: int = 0,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr = root / f"up-{self.port}.err"
        argv = [sys.executable, "-m", "fermium", "up", "--model", str(model), "--port", str(self.port),
                "--runner", "reference", "--drain-timeout", str(drain), "--log-level", "warning",
                "--metrics-port", str(metrics_port), *extra]
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                         env={**os.environ, **(env or {})})
        try:
            self.wait_serving(READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def children(self) -> dict[str, int]:
        """Role -> pid of the `fermium up` children alive now."""
        out = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()      # after the command name, which may hold spaces
            if int(fields[1]) == self.proc.pid and fields[0] != "Z" and b"fermium" in argv:
                out[argv[argv.index(b"fermium") + 1].decode()] = int(entry)
        return out

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=2.0)

    def wait_serving(self, timeout: float) -> None:
        wait_healthy(self.url, self.proc, timeout, lambda: self.stderr.read_text()[-3000:], "fermium up")

    def close(self) -> None:
        kids = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pid in kids.values():                              # nothing is left behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Stream(threading.Thread):
    """One streaming completion; records how it ended and when."""

    def __init__(self, url: str, prompt: str, max_tokens: int = LONG):
        super().__init__(daemon=True)
        self.url, self.body = url, dict(model="fermium", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stream=True)
        self.first_token = threading.Event()
        # outcome: finished | error (an SSE error event, then [DONE]) | dropped (the connection) |
        # http NNN (an error answer, before the first token)
        self.outcome = self.error = ""
        self.done = False                  # [DONE] came
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=self.body,
                              timeout=httpx.Timeout(60.0, connect=5.0)) as r:
                if r.status_code != 200:              # it failed before its first token
                    self.outcome, self.error = f"http {r.status_code}", json.loads(r.read())["error"]["message"]
                    return
                for line in r.iter_lines():
                    self._event(line)
        except httpx.HTTPError as e:
            self.outcome, self.error = self.outcome or "dropped", repr(e)
        finally:
            self.ended_at = self.ended_at or time.monotonic()
            self.first_token.set()

    def _event(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        if line == "data: [DONE]":
            self.done = True
            return
        event = json.loads(line[6:])
        if "error" in event:
            self.outcome, self.error, self.ended_at = "error", event["error"]["message"], time.monotonic()
        elif event.get("choices"):
            self.first_token.set()
            if event["choices"][0].get("finish_reason"):
                self.outcome, self.ended_at = "finished", time.monotonic()


def start_streams(up: Up, prompts: list[str], max_tokens: int = LONG) -> list[Stream]:
    streams = [Stream(up.url, p, max_tokens) for p in prompts]
    for s in streams:
        s.start()
    return streams


def answer(up: Up) -> str:
    r = httpx.post(f"{up.url}/v1/completions", json={"model": "fermium", **PROBE}, timeout=30.0)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def time_to_resume(up: Up, expected: str, since: float) -> float:
    """Seconds from `since` until a new request is answered, and answered right."""
    deadline = since + RESUME_WITHIN_S + 5
    while time.monotonic() < deadline:
        try:
            if answer(up) == expected:
                return time.monotonic() - since
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"serving did not resume: {up.stderr.read_text()[-3000:]}")


def ended(streams: list[Stream], since: float, name: str) -> list[float]:
    for s in streams:
        s.join(ERROR_WITHIN_S + 10)
        assert not s.is_alive(), f"{name}: a stream did not end"
    took = [round(s.ended_at - since, 3) for s in streams]
    figure(f"{name}: to the end of each stream", str(took) + " s, " + ", ".join(s.outcome for s in streams))
    return took


def three_free_ports() -> int:
    """The first of three consecutive free ports (router, prefill, decode /metrics)."""
    for _ in range(50):
        base = random.randint(20000, 60000)
        try:
            for port in range(base, base + 3):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no three consecutive free ports")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def metric(url: str, series: str) -> float:
    """One series of a /metrics page, e.g. 'fermium_num_requests_running'."""
    for line in httpx.get(url, timeout=2.0).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{url} exports no {series}")
