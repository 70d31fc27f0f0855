"""HAProxy's own answers (deploy/haproxy/errors/*.http) in OpenAI's error shape: each file is a
whole HTTP/1.1 response, CRLF-framed with a byte-exact Content-Length, whose body is an OpenAI error
object; haproxy.cfg names each one; and a real haproxy with no router up answers 503 with it. A
request HAProxy cannot parse gets its built-in 400 page before 3.2 (haproxy/haproxy#3032, fixed
there), so the 400 is checked from 3.2 on."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fermium.stack import free_port
from services.router.frontend.errors import TYPES

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "haproxy"
CONFIG = DEPLOY / "haproxy.cfg"
ERRORS = sorted((DEPLOY / "errors").glob("*.http"))
START_S = 30
needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, "the headers end with an empty CRLF line"
    lines = head.split(b"\r\n")
    assert all(b"\n" not in line and b"\r" not in line for line in lines), "CRLF line ends only"
    version, status, _ = lines[0].decode().split(" ", 2)
    assert version == "HTTP/1.1"
    headers = dict(line.decode().split(": ", 1) for line in lines[1:])
    return int(status), {k.lower(): v for k, v in headers.items()}, body


def test_there_is_a_file_for_each_error_haproxy_makes_itself():
    assert [p.stem for p in ERRORS] == ["400", "403", "408", "429", "500", "502", "503", "504"]


@pytest.mark.parametrize("path", ERRORS, ids=lambda p: p.stem)
def test_each_file_is_an_openai_error_response(path):
    status, headers, body = parse(path.read_bytes())
    assert status == int(path.stem)
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["code"] and error["param"] is None
    assert error["type"] == TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    assert ("retry-after" in headers) == (status in (429, 503))
    assert len(path.read_bytes()) < 16384, "an error file fits HAProxy's buffer"


def test_the_config_names_every_file():
    named = dict(re.findall(r"^\s*errorfile (\d+) (\S+)$", CONFIG.read_text(), re.M))
    assert named == {p.stem: f"errors/{p.name}" for p in ERRORS}
    assert re.search(r"^\s*default-path config$", CONFIG.read_text(), re.M), "paths are beside the config"


def _version() -> tuple[int, int]:
    out = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, check=True).stdout
    major, minor = re.search(r"version (\d+)\.(\d+)", out, re.I).groups()
    return int(major), int(minor)


@needs_haproxy
def test_haproxy_answers_its_own_errors_in_openai_shape(tmp_path):
    port = free_port()
    env = {**os.environ, "FERMIUM_LB_BIND": f"127.0.0.1:{port}",
           "FERMIUM_ROUTER_A": f"127.0.0.1:{free_port()}", "FERMIUM_ROUTER_B": f"127.0.0.1:{free_port()}"}
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(CONFIG)], env=env, cwd=tmp_path,   # not beside the files
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, "haproxy exited"
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "fermium"}, timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "haproxy did not start"
                time.sleep(0.2)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.content == parse((DEPLOY / "errors" / "503.http").read_bytes())[2]
        assert r.json()["error"]["type"] == "service_unavailable"
        if _version() < (3, 2):
            return
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        status, _, body = parse(raw)
        assert status == 400 and json.loads(body)["error"]["code"] == "bad_request"
    finally:
        proc.terminate()
        proc.wait(10)
