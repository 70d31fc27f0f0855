"""CURVE on the ZeroMQ links: encrypted beyond loopback, clients allow-listed, plaintext refused.

In-process: the socket policy, the bytes on the wire (through a relay that records them), and
peers with the wrong mechanism or key. With real processes: decode workers joining a router
that listens on a non-loopback address.
"""
from __future__ import annotations

import fcntl
import ipaddress
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest
import zmq

from common import security
from common.mp import PullQueue, PushQueue, open_socket
from common.protocol.router import Hello
from fermium.stack import Stack, free_port
from tests.stack_helpers import write_tiny_gguf

SIOCGIFADDR = 0x8915
DELIVERY_S = 3.0          # a loopback hop takes milliseconds; this is the "never arrives" bound
READY_TIMEOUT_S = 60      # three Python processes starting on a shared 2-core machine
ROGUE_TIMEOUT_S = 4       # a refused worker gives up after this ready timeout


def non_loopback_ipv4() -> str | None:
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        ip = socket.inet_ntoa(packed[20:24])
        if not ipaddress.ip_address(ip).is_loopback:
            return ip
    return None


# bind on the machine's own address where it has one; all interfaces otherwise
HOST_IP = non_loopback_ipv4()
BIND_HOST, CONNECT_HOST = (HOST_IP, HOST_IP) if HOST_IP else ("0.0.0.0", "127.0.0.1")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Deployment keys for router/prefill/decode, a revoked host's bundle, and another deployment's."""
    root = tmp_path_factory.mktemp("keys")
    bundles = security.create_key_bundles(root / "ours", ["router", "prefill", "decode", "revoked"])
    shutil.copytree(bundles["revoked"], root / "revoked")
    for f in (root / "ours" / "clients").glob("revoked.*"):
        f.unlink()
    security.create_key_bundles(root / "ours", [])
    other = security.create_key_bundles(root / "theirs", ["decode"])
    return {"router": bundles["router"], "prefill": bundles["prefill"], "decode": bundles["decode"],
            "revoked": root / "revoked", "other": other["decode"]}


@pytest.fixture
def policy():
    """Set this process's policy for one test, and put the default back after it (the ZAP
    handler stays up: it is one per context and is reconfigured by every bind)."""
    yield security.configure
    security.configure(None, False)


def test_loopback_check():
    for address in ("tcp://127.0.0.1:5560", "tcp://127.0.0.2:1", "tcp://localhost:0", "tcp://[::1]:9",
                    "tcp://lo:5", "ipc:///tmp/x", "inproc://y"):
        assert security.is_loopback(address), address
    for address in ("tcp://0.0.0.0:5560", "tcp://*:5560", "tcp://192.0.2.7:1", "tcp://[::]:1",
                    "tcp://eth0:5560", "tcp://no-such-host.invalid:1"):
        assert not security.is_loopback(address), address


def test_refuses_plaintext_beyond_loopback_unless_insecure(policy):
    policy(None, False)
    for bind, address in ((True, f"tcp://{BIND_HOST}:0"), (True, "tcp://0.0.0.0:0"), (False, "tcp://192.0.2.7:1")):
        with pytest.raises(security.InsecureBindError, match="--insecure"):
            open_socket(zmq.PULL if bind else zmq.PUSH, address, bind=bind)
    open_socket(zmq.PULL, "tcp://127.0.0.1:0", bind=True).close()
    policy(None, True)
    open_socket(zmq.PULL, f"tcp://{BIND_HOST}:0", bind=True).close()


class Relay:
    """A TCP relay on loopback that forwards to `target` and records every byte both ways."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.captured = target, bytearray()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.captured += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        self.server.close()


def _send_through_relay(marker: str) -> tuple[Hello | None, bytes, int]:
    """One Hello carrying `marker`, over a relay to an inbox bound beyond loopback."""
    inbox = PullQueue(f"tcp://{BIND_HOST}:0", name="curve-test")
    relay = Relay((CONNECT_HOST, int(inbox.address.rsplit(":", 1)[1])))
    push = PushQueue(f"tcp://127.0.0.1:{relay.port}", name="curve-test-push")
    try:
        push.put(Hello(uuid.uuid4().hex, "w1", "decode", "tcp://x:1", 1, marker))
        got = inbox.get(timeout=DELIVERY_S)
        return got, bytes(relay.captured), inbox._sock.getsockopt(zmq.MECHANISM)
    finally:
        push.close()
        inbox.close()
        relay.close()


def test_traffic_beyond_loopback_is_encrypted(keys, policy):
    marker = "PLAINTEXT-" + uuid.uuid4().hex
    policy(keys["decode"])
    got, wire, mechanism = _send_through_relay(marker)
    assert got is not None and got.model == marker, "the CURVE link must deliver"
    assert mechanism == zmq.CURVE
    assert len(wire) > 0 and marker.encode() not in wire
    policy(None, True)                 # the control: the same bytes in plaintext are visible
    got, wire, mechanism = _send_through_relay(marker)
    assert got is not None and mechanism == zmq.NULL and marker.encode() in wire


def _raw_push(address: str, setup) -> None:
    """Send one Hello from a hand-made PUSH socket (own context, no Fermium policy)."""
    from common.protocol import encode_message
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(DELIVERY_S * 1000))
    setup(sock)
    sock.connect(address)
    try:
        sock.send_multipart(encode_message(Hello(uuid.uuid4().hex, "rogue", "decode", "tcp://x:1", 1, "rogue")))
    except zmq.Again:              # no handshake ever completed, so there was no peer to queue for
        pass
    finally:
        sock.close()
        ctx.term()


@pytest.mark.parametrize("peer", ["null", "revoked", "other"])
def test_wrong_peers_are_refused(keys, policy, peer):
    policy(keys["router"])
    inbox = PullQueue(f"tcp://{BIND_HOST}:0", name="curve-refuse")
    address = inbox.address.replace(BIND_HOST, CONNECT_HOST)

    def setup(sock: zmq.Socket) -> None:
        if peer == "null":
            return
        server_public, _ = zmq.auth.load_certificate(keys[peer] / "server.key")
        client_public, client_secret = zmq.auth.load_certificate(keys[peer] / "client.key_secret")
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = client_public, client_secret, server_public

    try:
        _raw_push(address, setup)
        assert inbox.get(timeout=DELIVERY_S) is None, f"a {peer} peer got a message through"
        policy(keys["decode"])         # and an allowed client still gets through
        push = PushQueue(address, name="allowed")
        push.put(Hello(uuid.uuid4().hex, "ok", "decode", "tcp://x:1", 1, "ok"))
        assert inbox.get(timeout=DELIVERY_S) is not None
        push.close()
    finally:
        inbox.close()


# ---- real processes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secure_stack(keys, tmp_path_factory):
    root = tmp_path_factory.mktemp("curve-stack")
    model = write_tiny_gguf(root / "tiny.gguf")
    workers_port = free_port()
    router_address = f"tcp://{CONNECT_HOST}:{workers_port}"
    listen = ["--listen", f"tcp://{BIND_HOST}:0"]
    extra = {"router": ["--workers", f"tcp://{BIND_HOST}:{workers_port}", "--curve-dir", str(keys["router"])],
             "prefill": ["--router", router_address, *listen, "--curve-dir", str(keys["prefill"])],
             "decode": ["--router", router_address, *listen, "--curve-dir", str(keys["decode"])]}
    with Stack(str(model), port=free_port(), runner="reference", extra=extra, log_dir=root) as s:
        s.wait_ready(READY_TIMEOUT_S)
        s.router_address, s.root = router_address, root
        yield s


@pytest.fixture(scope="module")
def rogue_workers(secure_stack, keys) -> dict[str, tuple[int, str]]:
    """Decode workers that must not join, started together: {case: (exit code, output)}."""
    cases = {"revoked": ["--curve-dir", str(keys["revoked"])], "other": ["--curve-dir", str(keys["other"])],
             "plaintext": [], "insecure": ["--insecure"]}
    procs = {case: subprocess.Popen(
        [sys.executable, "-m", "fermium", "decode", "--model", secure_stack.model, "--router",
         secure_stack.router_address, "--listen", f"tcp://{BIND_HOST}:0", "--runner", "reference",
         "--ready-timeout", str(ROGUE_TIMEOUT_S), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for case, flags in cases.items()}
    return {case: (p.wait(timeout=120), p.stdout.read()) for case, p in procs.items()}


def _workers(stack) -> list[dict]:
    return stack.health()["workers"]


def test_stack_with_keys_serves_over_curve(secure_stack):
    import httpx
    assert sorted(w["role"] for w in _workers(secure_stack)) == ["decode", "prefill"]
    r = httpx.post(f"{secure_stack.url}/v1/completions", timeout=60,
                   json={"model": "fermium", "prompt": "the cat", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("who", ["revoked", "other"])
def test_decode_worker_with_wrong_key_cannot_join(secure_stack, rogue_workers, who):
    code, output = rogue_workers[who]
    assert code != 0 and "did not answer the ready handshake" in output, output
    assert len(_workers(secure_stack)) == 2


def test_plaintext_decode_worker_is_refused(rogue_workers):
    code, output = rogue_workers["plaintext"]
    assert code != 0 and "--insecure" in output, output         # refused by its own policy
    code, output = rogue_workers["insecure"]
    assert code != 0 and "did not answer the ready handshake" in output, output   # by the router


def test_decode_worker_with_right_key_joins(secure_stack):
    secure_stack.argv["decode-b"] = list(secure_stack.argv["decode"])   # same keys, its own inbox
    secure_stack.start("decode-b")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(_workers(secure_stack)) < 3:
        assert time.monotonic() < deadline, "a decode worker with the deployment's keys did not join"
        assert secure_stack.procs["decode-b"].poll() is None, "the second decode worker exited"
        time.sleep(0.2)
    assert sorted(w["role"] for w in _workers(secure_stack)) == ["decode", "decode", "prefill"]


def test_router_refuses_a_plaintext_non_loopback_bind(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    r = subprocess.run([sys.executable, "-m", "fermium", "router", "--model", str(model), "--port", str(free_port()),
                        "--workers", f"tcp://{BIND_HOST}:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "refusing to bind" in r.stderr and "--insecure" in r.stderr, r.stderr
