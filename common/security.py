"""ZeroMQ CURVE security: key files, the allow-list, and the per-socket policy.

One key directory per host (`fermium keys` writes one for each host of a deployment):

    server.key, server.key_secret   the deployment's server pair: every bound inbox presents it
    client.key, client.key_secret   this host's own pair: it connects with it
    authorized/*.key                public client keys allowed to connect (one per host)

The policy, applied by `common.mp.open_socket` to every socket it creates:
- keys configured: every tcp socket runs CURVE (encrypted, authenticated); a bound socket admits
  only the clients in `authorized/`, checked by a ZAP handler (zmq.auth ThreadAuthenticator);
- no keys: loopback addresses (and ipc/inproc) run plain; a non-loopback address is refused
  unless the operator said `--insecure` (FERMIUM_INSECURE=1).

A process sets its policy once with `configure()`; without a call, FERMIUM_CURVE_DIR and
FERMIUM_INSECURE decide.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from common.errors import UserError

log = logging.getLogger("fermium.security")

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"
ENV_CURVE_DIR, ENV_INSECURE = "FERMIUM_CURVE_DIR", "FERMIUM_INSECURE"
LOCAL_TRANSPORTS = ("ipc://", "inproc://")


class InsecureBindError(UserError, OSError):
    """A plaintext socket on an address other hosts can reach, without --insecure."""


@dataclass(frozen=True)
class CurveKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized: Path              # directory of allowed client public keys

    @classmethod
    def load(cls, directory: str | Path) -> "CurveKeys":
        d = Path(directory)
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CURVE; install pyzmq's wheel (it bundles libsodium)")
        try:
            server_public, server_secret = zmq.auth.load_certificate(d / f"{SERVER}.key_secret")
            client_public, client_secret = zmq.auth.load_certificate(d / f"{CLIENT}.key_secret")
        except (OSError, ValueError) as e:
            raise FileNotFoundError(
                f"cannot read the CURVE keys in {d}: {e}. A key directory holds server.key_secret, "
                f"client.key_secret and authorized/*.key; create one with `fermium keys create`.") from None
        authorized = d / AUTHORIZED
        if not authorized.is_dir() or not any(authorized.glob("*.key")):
            raise FileNotFoundError(f"{authorized} lists no allowed client keys (*.key); "
                                    "`fermium keys create` writes it")
        return cls(server_public, server_secret, client_public, client_secret, authorized)


@dataclass(frozen=True)
class SecurityPolicy:
    keys: CurveKeys | None = None
    insecure: bool = False

    @classmethod
    def from_env(cls) -> "SecurityPolicy":
        curve_dir = os.environ.get(ENV_CURVE_DIR, "")
        insecure = os.environ.get(ENV_INSECURE, "").lower() in ("1", "true", "yes", "on")
        return cls(CurveKeys.load(curve_dir) if curve_dir else None, insecure)


_policy: SecurityPolicy | None = None
_authenticators: dict[int, ThreadAuthenticator] = {}
_lock = threading.Lock()


def configure(curve_dir: str | Path | None = None, insecure: bool = False) -> SecurityPolicy:
    """Set this process's policy (the service CLIs call it from --curve-dir / --insecure)."""
    global _policy
    _policy = SecurityPolicy(CurveKeys.load(curve_dir) if curve_dir else None, insecure)
    if _policy.keys:
        log.info("CURVE on: clients allowed from %s", _policy.keys.authorized)
    return _policy


def policy() -> SecurityPolicy:
    global _policy
    if _policy is None:
        _policy = SecurityPolicy.from_env()
    return _policy


def _host_of(address: str) -> str:
    host = address.split("://", 1)[1].rsplit(":", 1)[0]
    if ";" in host:                   # tcp://source;dest form: the destination decides
        host = host.split(";", 1)[1]
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    """True when only this machine can reach `address` (loopback IPs, localhost, ipc, inproc)."""
    if address.startswith(LOCAL_TRANSPORTS):
        return True
    if not address.startswith("tcp://"):
        return False
    host = _host_of(address)
    if host in ("*", "", "0.0.0.0", "::"):
        return False
    if host == "lo":                  # a bind may name the interface
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def _authenticator(ctx: zmq.Context, allowed: Path) -> None:
    """Start the context's ZAP handler once; it admits the public keys in `allowed`."""
    with _lock:
        auth = _authenticators.get(id(ctx))
        if auth is None:
            auth = _authenticators[id(ctx)] = ThreadAuthenticator(ctx, log=logging.getLogger("fermium.zap"))
            auth.start()
        auth.configure_curve(domain="*", location=str(allowed))


def apply(sock: zmq.Socket, address: str, *, bind: bool) -> None:
    """Set CURVE options on `sock` before it binds/connects `address`, or refuse a plaintext
    socket beyond loopback. Raises InsecureBindError with the fix."""
    pol = policy()
    if address.startswith(LOCAL_TRANSPORTS):
        return
    if pol.keys is None:
        if is_loopback(address):
            return
        verb = "bind" if bind else "connect to"
        if not pol.insecure:
            raise InsecureBindError(
                f"refusing to {verb} {address} without encryption: it is reachable from other hosts. "
                "Pass --curve-dir DIR (FERMIUM_CURVE_DIR) with keys from `fermium keys create`, "
                "use a loopback address, or accept plaintext with --insecure (FERMIUM_INSECURE=1).")
        log.warning("plaintext ZeroMQ: %s %s without CURVE (--insecure)", verb, address)
        return
    k = pol.keys
    if bind:
        _authenticator(sock.context, k.authorized)
        sock.curve_secretkey = k.server_secret
        sock.curve_publickey = k.server_public
        sock.curve_server = True
    else:
        sock.curve_secretkey = k.client_secret
        sock.curve_publickey = k.client_public
        sock.curve_serverkey = k.server_public


def create_key_bundles(out: str | Path, hosts: list[str]) -> dict[str, Path]:
    """Create or extend a deployment's keys in `out`, and rebuild one key directory per host.

    out/server.key*            the deployment's server pair (made once, kept)
    out/clients/HOST.key*      one client pair per host (made once, kept; delete one to revoke it)
    out/hosts/HOST/            what to copy to HOST as its --curve-dir
    Returns {host: its key directory} for every host with a client pair.
    """
    out = Path(out)
    clients = out / "clients"
    clients.mkdir(parents=True, exist_ok=True)
    if not (out / f"{SERVER}.key_secret").exists():
        zmq.auth.create_certificates(out, SERVER)
    for host in hosts:
        if not host or "/" in host or host.startswith("."):
            raise ValueError(f"{host!r} is not a usable host name for a key file")
        if not (clients / f"{host}.key_secret").exists():
            zmq.auth.create_certificates(clients, host)
    bundles = {}
    names = sorted(p.name[:-len(".key_secret")] for p in clients.glob("*.key_secret"))
    for revoked in (out / "hosts").glob("*") if (out / "hosts").is_dir() else ():
        if revoked.name not in names:
            shutil.rmtree(revoked)
    for host in names:
        d = out / "hosts" / host
        (d / AUTHORIZED).mkdir(parents=True, exist_ok=True)
        for stale in (d / AUTHORIZED).glob("*.key"):
            stale.unlink()
        for other in names:
            (d / AUTHORIZED / f"{other}.key").write_bytes((clients / f"{other}.key").read_bytes())
        for src, dst in ((out / f"{SERVER}.key", SERVER), (clients / f"{host}.key", CLIENT)):
            (d / f"{dst}.key").write_bytes(src.read_bytes())
            secret = d / f"{dst}.key_secret"
            secret.write_bytes(src.with_name(src.name + "_secret").read_bytes())
            secret.chmod(0o600)
        bundles[host] = d
    return bundles
