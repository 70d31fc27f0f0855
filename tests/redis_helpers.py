"""A real redis-server for the tests that share snapshots: on a free port, nothing saved to disk,
an LRU byte budget; it can be killed and started again on the same port. With `tls`, it speaks
TLS only, with a certificate of a CA made for it (openssl): `ca` is that CA's file."""
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


def make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """(CA file, server certificate, its key) for 127.0.0.1, made with openssl."""
    folder.mkdir(exist_ok=True)
    ca, ca_key, cert, key = (folder / n for n in ("ca.pem", "ca.key", "server.pem", "server.key"))
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
        "-subj", "/CN=fermium test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(folder / "server.csr"),
        "-subj", "/CN=127.0.0.1")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(folder / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(folder / "ext"))
    return ca, cert, key


class RedisServer:
    def __init__(self, workdir: Path, maxmemory: str = BUDGET, tls: bool = False):
        self.port, self.workdir, self.maxmemory = free_port(), workdir, maxmemory
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.ca, self.tls_args = None, []
        if tls:
            self.ca, cert, key = make_certs(workdir / "tls")
            self.tls_args = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                             "--tls-key-file", str(key), "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru", "--dir", str(self.workdir),
             *self.tls_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
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
        tls = {"ssl": True, "ssl_ca_certs": str(self.ca)} if self.ca else {}
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0, **tls)
