"""A real redis-server for the tests that share snapshots: on a free port, nothing saved to disk,
an LRU byte budget; it can be killed and started again on the same port."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from fermium.stack import free_port

START_S = 10.0
BUDGET = "512mb"

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (tools/ci_system_deps.sh installs it)")


class RedisServer:
    def __init__(self, workdir: Path, maxmemory: str = BUDGET):
        self.port, self.workdir, self.maxmemory = free_port(), workdir, maxmemory
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1.0)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2.0)
