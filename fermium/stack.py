"""The whole stack as child processes on loopback (`fermium up`), and a small streaming chat
client (`fermium chat`, `fermium up --chat`).

The children share a worker token that the stack makes for them (FERMIUM_WORKER_TOKEN in
their environment). They are stopped router first: it drains its requests for at most
`drain_timeout` seconds, and then the workers go, so that every child is gone within
`drain_timeout` plus ROUTER_EXIT_S and WORKER_EXIT_S (under the 5 s that issue 27 allows).
`fermium.supervisor` restarts the children that die.
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from common.worker_token import ENV as TOKEN_ENV
from common.worker_token import new_token
from services.router.frontend.exposure import API_KEY_ENV

DRAIN_TIMEOUT_S = 5.0        # of a Stack made by tests and tools; `fermium up` passes its own
ROUTER_EXIT_S = 3.0          # the router's wait for connections after its drain, and its exit
WORKER_EXIT_S = 1.5          # a worker's loop notices SIGTERM within one step


_PORTS = random.Random()                  # its own stream: callers that seed `random` do not replay it
_ISSUED: collections.deque = collections.deque(maxlen=256)


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range where it can: the services'
    own ZeroMQ sockets bind port 0, and would otherwise be handed a port chosen here before its
    owner binds it."""
    low = _ephemeral_low()
    for _ in range(64):
        port = _PORTS.randrange(max(1024, low - 12000), low)
        if port in _ISSUED:                   # handed out already, perhaps not bound yet
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ISSUED.append(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class Stack:
    """Router, prefill and decode as children of this process; stopped on exit, whatever happens.

    `workers` lists the worker processes by name; a name's role is its text before any "-"
    (e.g. "decode-b" is a second decode worker). `extra[name]` adds command-line flags. A
    `runner` or `backend` of None leaves the decode or prefill service's own default.
    """

    def __init__(self, model: str, *, port: int, runner: str | None = None, backend: str | None = None,
                 metrics_ports: dict[str, int] | None = None, workers: tuple[str, ...] = ("prefill", "decode"),
                 extra: dict[str, list[str]] | None = None, log_dir: Path | None = None,
                 drain_timeout: float = DRAIN_TIMEOUT_S):
        self.model, self.port, self.drain_timeout = model, port, drain_timeout
        self.token = new_token()
        self.url = f"http://127.0.0.1:{port}"
        self.workers = f"tcp://127.0.0.1:{free_port()}"
        metrics_ports, extra = metrics_ports or {}, extra or {}
        role_argv = {"prefill": ["--router", self.workers, *(["--backend", backend] if backend else [])],
                     "decode": ["--router", self.workers, *(["--runner", runner] if runner else [])]}
        self.argv = {"router": ["router", "--port", str(port), "--workers", self.workers,
                                "--drain-timeout", str(drain_timeout)]}
        for name in workers:
            role = name.split("-")[0]
            self.argv[name] = [role, *role_argv[role]]
        for name, argv in self.argv.items():
            argv += ["--model", model, "--metrics-port", str(metrics_ports.get(name, 0)), *extra.get(name, [])]
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> subprocess.Popen:
        """Start (or restart) one child."""
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else None
        proc = subprocess.Popen([sys.executable, "-m", "fermium", *self.argv[name]], stdout=out,
                                stderr=subprocess.STDOUT if out else None, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", TOKEN_ENV: self.token})
        if out:
            out.close()
        self.procs[name] = proc
        return proc

    def __enter__(self) -> "Stack":
        for name in self.argv:
            self.start(name)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _dead(self) -> list[str]:
        return [f"{role} exited with code {p.returncode}" for role, p in self.procs.items() if p.poll() is not None]

    def health(self) -> dict:
        """/health's detail (with the API key of the environment, which the router reads too)."""
        return httpx.get(f"{self.url}/health", headers=api_headers(), timeout=2.0).json()

    def wait_ready(self, timeout: float) -> None:
        """Until /health lists every worker; a child that dies ends the wait."""
        want = len(self.procs) - 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if dead := self._dead():
                where = f"in {self.log_dir}" if self.log_dir else "above"
                raise RuntimeError(f"the stack did not start: {', '.join(dead)} (see its messages {where})")
            try:
                if len(self.health().get("workers", ())) >= want:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the stack was not ready within {timeout:.0f} s; is port {self.port} free?")

    def stop(self) -> None:
        """SIGTERM to the router, which drains; then to the workers. Whatever is left is killed,
        at once when Ctrl-C interrupts the wait."""
        router = [p for name, p in self.procs.items() if name == "router"]
        try:
            _end(router, self.drain_timeout + ROUTER_EXIT_S)
            _end([p for name, p in self.procs.items() if name != "router"], WORKER_EXIT_S)
        except KeyboardInterrupt:
            _end(list(self.procs.values()), 0.0)
            raise

    def hurry(self) -> None:
        """A second SIGTERM to every child still running: the router then stops without draining."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)


def _end(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def api_headers() -> dict[str, str]:
    """The router's API key from this environment (FERMIUM_API_KEY), as its header; none without one."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat_events(url: str, body: dict):
    """The server-sent events of one streamed chat completion, as dicts; an HTTP error or an error
    event ends the program with its message. httpx.TransportError reaches the caller."""
    timeout = httpx.Timeout(None, connect=10.0)   # an answer takes as long as it takes; a connection does not
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=api_headers(), timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"error {r.status_code}: {r.text}")
        for event in sse_events(r):
            if "error" in event:
                raise SystemExit(f"\nerror: {event['error']['message']}")
            yield event


def sse_events(r: httpx.Response):
    """The JSON events of a streamed response's server-sent events, up to its [DONE]."""
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def stream_chat(url: str, message: str, *, max_tokens: int = 128, temperature: float = 0.0,
                model: str = "fermium") -> str:
    """POST one chat message, print the answer as it streams, return it."""
    body = {"model": model, "messages": [{"role": "user", "content": message}], "stream": True,
            "max_tokens": max_tokens, "temperature": temperature}
    parts = []
    try:
        for event in chat_events(url, body):
            text = event["choices"][0]["delta"].get("content") or ""
            parts.append(text)
            print(text, end="", flush=True)
    except httpx.TransportError as e:   # no router there, or it went away mid-answer
        raise SystemExit(f"\nerror: lost the router at {url}: {e}" if parts else
                         f"error: cannot reach the router at {url}: {e}") from None
    print()
    return "".join(parts)
