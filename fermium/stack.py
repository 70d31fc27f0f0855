"""The whole stack as child processes on loopback (`fermium up`), and a small streaming chat
client (`fermium chat`, `fermium up --chat`)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

STOP_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """Router, prefill and decode as children of this process; stopped on exit, whatever happens."""

    def __init__(self, model: str, *, port: int, engine: str = "auto", backend: str = "cpu",
                 metrics_port: int = 0, extra: dict[str, list[str]] | None = None, quiet: bool = False):
        self.model, self.port = model, port
        self.url = f"http://127.0.0.1:{port}"
        self.workers = f"tcp://127.0.0.1:{free_port()}"
        metrics = {role: str(metrics_port + i if metrics_port else 0)
                   for i, role in enumerate(("router", "prefill", "decode"))}
        extra = extra or {}
        self.argv = {
            "router": ["router", "--port", str(port), "--workers", self.workers],
            "prefill": ["prefill", "--router", self.workers, "--backend", backend],
            "decode": ["decode", "--router", self.workers, "--engine", engine],
        }
        for role, argv in self.argv.items():
            argv += ["--model", model, "--metrics-port", metrics[role], *extra.get(role, [])]
        self.quiet = quiet
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, role: str) -> subprocess.Popen:
        out = subprocess.DEVNULL if self.quiet else None
        proc = subprocess.Popen([sys.executable, "-m", "fermium", *self.argv[role]], stdout=out, stderr=out,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs[role] = proc
        return proc

    def __enter__(self) -> "Stack":
        for role in ("router", "prefill", "decode"):
            self.start(role)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _dead(self) -> list[str]:
        return [f"{role} exited with code {p.returncode}" for role, p in self.procs.items() if p.poll() is not None]

    def wait_ready(self, timeout: float) -> None:
        """Until /health says both workers are attached; a child that dies ends the wait."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if dead := self._dead():
                raise RuntimeError(f"the stack did not start: {', '.join(dead)} (see its messages above)")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the stack was not ready within {timeout:.0f} s; is port {self.port} free?")

    def wait(self) -> None:
        """Until Ctrl-C, or until a child dies."""
        try:
            while not (dead := self._dead()):
                time.sleep(0.5)
            print(f"stopping: {', '.join(dead)}", file=sys.stderr)
        except KeyboardInterrupt:
            print("\nstopping", file=sys.stderr)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def stream_chat(url: str, message: str, *, max_tokens: int = 128, temperature: float = 0.0,
                model: str = "fermium") -> str:
    """POST one chat message, print the answer as it streams, return it."""
    body = {"model": model, "messages": [{"role": "user", "content": message}], "stream": True,
            "max_tokens": max_tokens, "temperature": temperature}
    parts = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=None) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"error {r.status_code}: {r.text}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise SystemExit(f"\nerror: {event['error']['message']}")
            text = event["choices"][0]["delta"].get("content") or ""
            parts.append(text)
            print(text, end="", flush=True)
    print()
    return "".join(parts)
