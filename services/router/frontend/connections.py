"""The router's HTTP/1.1 connections: uvicorn's h11 protocol with deadlines on what a client owes.

uvicorn bounds only the idle time between two requests (`timeout_keep_alive`), so a client that
dribbles its headers, stops mid-body or stops reading its response would hold its connection,
its buffered body and, for a stream, its admission slot for as long as it stays connected. Here:
- a request's headers must arrive within `header_timeout` s of the connection or of the last
  response (`--header-timeout`);
- its body within `body_timeout` s of its headers (`--body-timeout`);
- a response that waits on the client (the transport's buffer above its high-water mark) must
  see the client take some bytes every `send_timeout` s (`--send-timeout`).
A late request gets a 408 in the API's error shape and the connection closes; a connection that
has sent nothing of a next request closes quietly. A client that takes no bytes is cut off at once
(a reset: what it did not take is dropped, not flushed). Either way the app sees a disconnect, so
the request's body, its queued tokens and its admission slot are let go as when a client leaves.
"""
from __future__ import annotations

import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from common.log_limit import LogLimiter
from common.metrics import RouterMetrics

from ..config import RouterConfig
from .errors import ANTHROPIC_PREFIX, APIError

log = logging.getLogger("fermium.router")
complain = LogLimiter(log, "router: slow clients cut off")     # one for all connections: a flood logs a few

MAX_HEADER_BYTES = 16 << 10     # h11's bound on a request line and headers; more is a 400
SEND_CHECKS = 4                 # looks at a waiting response per send_timeout: dropped within 1.25x of it


@dataclass(frozen=True)
class Deadlines:
    header: float = RouterConfig.header_timeout
    body: float = RouterConfig.body_timeout
    send: float = RouterConfig.send_timeout


class DeadlineProtocol(H11Protocol):
    """uvicorn's H11Protocol, with the read and send deadlines of `deadlines`; `dropped(reason)` counts
    each connection it ends (reason: one of common.metrics.CLIENT_DROP_REASONS)."""

    deadlines = Deadlines()
    dropped: Callable[[str], None] = staticmethod(lambda reason: None)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer = self._send_timer = None
        self._phase: tuple[Any, Any] = (None, None)     # (their h11 state, the cycle) the read timer is for
        self._unsent, self._taken_at = 0, 0.0
        self._watch_reads()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_reads()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_reads()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._read_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._read_timer = self._send_timer = None
        super().connection_lost(exc)

    # ---- reads: headers, then the body
    def _watch_reads(self) -> None:
        state = self.conn.their_state
        if state is self._phase[0] and self.cycle is self._phase[1]:
            return
        self._phase = (state, self.cycle)
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self.transport.is_closing():
            return
        if state is h11.IDLE:
            self._read_timer = self.loop.call_later(self.deadlines.header, self._late, "headers")
        elif state is h11.SEND_BODY:
            self._read_timer = self.loop.call_later(self.deadlines.body, self._late, "body")

    def _late(self, what: str) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if what == "headers" and not self.conn.trailing_data[0]:
            self.transport.close()                      # idle: nothing of a next request came
            return
        limit = self.deadlines.header if what == "headers" else self.deadlines.body
        self.dropped(what)
        complain("router: the %s of a request from %s did not arrive within %g s; closing the connection",
                 what, "%s:%d" % self.client[:2] if self.client else "a client", limit)
        answer = what == "headers" or not self.cycle.response_started
        if what == "body":
            self.cycle.disconnected = True              # the handler reading the body sees a disconnect
            self.cycle.message_event.set()
        if answer:
            path = self.cycle.scope["path"] if what == "body" else ""
            self.transport.write(timeout_reply(f"the request's {what} did not arrive within {limit:g} s", path))
        self.transport.close()

    # ---- sends: a response waiting on its client
    def pause_writing(self) -> None:
        super().pause_writing()
        self._unsent, self._taken_at = self.transport.get_write_buffer_size(), self.loop.time()
        self._send_timer = self.loop.call_later(self.deadlines.send / SEND_CHECKS, self._check_send)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _check_send(self) -> None:
        self._send_timer = None
        if self.transport.is_closing():
            return
        unsent, now = self.transport.get_write_buffer_size(), self.loop.time()
        if unsent < self._unsent:                       # the client took some
            self._unsent, self._taken_at = unsent, now
        if now - self._taken_at < self.deadlines.send:
            self._send_timer = self.loop.call_later(self.deadlines.send / SEND_CHECKS, self._check_send)
            return
        self.dropped("send")
        complain("router: %s took no bytes for %g s; dropping its connection (%d bytes unsent)",
                 "%s:%d" % self.client[:2] if self.client else "a client", self.deadlines.send, unsent)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:                            # a reset: the kernel's unsent bytes go too
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def timeout_reply(message: str, path: str) -> bytes:
    """A whole 408 response that closes the connection, in the error shape of `path`'s API."""
    err = APIError(408, message, code="request_timeout")
    body = json.dumps(err.anthropic_body() if path.startswith(ANTHROPIC_PREFIX) else err.body()).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


def http_options(cfg: RouterConfig, metrics: RouterMetrics) -> dict[str, Any]:
    """uvicorn.Config's HTTP settings for the router: this protocol with cfg's deadlines, uvicorn's
    keep-alive time and h11's header bound."""
    deadlines = Deadlines(cfg.header_timeout, cfg.body_timeout, cfg.send_timeout)
    protocol = type("RouterProtocol", (DeadlineProtocol,),
                    {"deadlines": deadlines, "dropped": staticmethod(metrics.client_dropped)})
    return {"http": protocol, "timeout_keep_alive": cfg.keep_alive_timeout,
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES}
