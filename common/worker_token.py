"""The worker token: the shared secret a worker shows in its Hello and Heartbeats, so that only
workers of this deployment are admitted, even on loopback.

Where it comes from, first match wins:
1. `--worker-token` / FERMIUM_WORKER_TOKEN: `fermium up` sets a random one for its children,
   the systemd environment file carries one (`fermium deploy env` writes it).
2. A token file that processes of the same user on the same host share: `worker-token` in
   $STATE_DIRECTORY (systemd's StateDirectory), else $XDG_STATE_HOME/fermium, else
   ~/.local/state/fermium. Whichever process comes first creates it (mode 0600, under a file
   lock), so `fermium router` and `fermium decode` started by hand find each other.
"""
from __future__ import annotations

import fcntl
import hmac
import os
import secrets
from pathlib import Path

ENV = "FERMIUM_WORKER_TOKEN"
FILE_NAME = "worker-token"
TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def token_path() -> Path:
    if os.environ.get("STATE_DIRECTORY"):              # systemd: may list several, the first is ours
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / FILE_NAME
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fermium" / FILE_NAME


def shared_token(path: Path | None = None) -> str:
    """The token in the per-user token file, created on first use."""
    path = path or token_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise OSError(f"cannot keep the worker token in {path} ({e.strerror}): pass --worker-token "
                      f"or set {ENV}, the same for the router and its workers") from None
    with os.fdopen(fd, "r+") as f:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} must belong to this user with mode 0600 (it is a secret): "
                                  f"chmod 600 {path}, or pass --worker-token")
        fcntl.flock(f, fcntl.LOCK_EX)                  # two processes starting at once agree on one
        token = f.read().strip()
        if not token:
            token = new_token()
            f.write(token)
            f.flush()
            os.fsync(fd)
        return token


def resolve(explicit: str | None = None) -> str:
    """The token to use: the explicit one, FERMIUM_WORKER_TOKEN, or the shared token file."""
    return explicit or os.environ.get(ENV) or shared_token()


def matches(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())
