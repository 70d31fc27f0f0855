"""Where a worker's /metrics port listens: the host of its ZeroMQ --listen address."""
from __future__ import annotations

import socket

from .errors import UserError


def listen_host(address: str) -> str:
    """The host a ZeroMQ bind address listens on (tcp://HOST:PORT; `*` is every interface), where a
    worker's /metrics listens too by default; loopback for ipc:// and local:// addresses."""
    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        return "127.0.0.1"
    host = rest.rpartition(":")[0].strip("[]")
    if host in ("*", ""):
        return "0.0.0.0"
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):       # e.g. an interface name, which ZeroMQ binds and HTTP cannot
        raise MetricsHostError(f"--listen {address}: {host!r} is no address the /metrics port can listen on; "
                               "give it one with --metrics-host") from None
    return host


class MetricsHostError(UserError, ValueError):
    """A worker whose /metrics address cannot come from its --listen address."""
