"""Typed ZeroMQ wrappers: one per pattern, each owning its socket, its codec and an IO thread.

- `open_socket` is the one place sockets are created (LINGER=0, high-water marks, MAXMSGSIZE);
  `common.security` applies CURVE there.
- `PullQueue[T]`: a bound PULL inbox. Its thread decodes frames with `common.protocol` and hands
  each message to a callback or to `get()`. Nothing one message does stops the thread: a frame
  that does not decode, is too large or makes the handler raise is counted (`errors`, by
  reason), logged at a bounded rate, and passed to `on_error` when it did not decode.
- `PushQueue[T]`: a PUSH connection to one peer. `put()` encodes in the caller (so a bad message
  fails where it was made) and returns; the thread sends, zero-copy for large arrays. With
  `on_disconnect`, the thread also watches the connection and calls it once when a peer that
  was connected goes away. `close()` never waits unless asked to.

The compute loop of a service never touches a socket: it only calls `get()` and `put()`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Generic, TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import security
from .log_limit import LogLimiter
from .protocol import Message, ProtocolError, decode_frames, encode_message
from .protocol.codec import WireLimits

T = TypeVar("T", bound=Message)
log = logging.getLogger("fermium.mp")

POLL_MS = 100              # how often IO threads look at their stop flag
MONITOR_POLL_S = 0.02      # how often a watching PushQueue looks at its connection events
SEND_TIMEOUT_MS = 5000     # a peer that takes no message for this long is treated as gone
HWM = 10_000
INBOX_HWM = 1_000          # messages an inbox buffers per peer; beyond it the sender waits


def _context() -> zmq.Context:
    return zmq.Context.instance()


def normalize_address(address: str) -> str:
    """Accept `tcp://host:0` for "any free port" (ZeroMQ spells it `*`)."""
    return address[:-2] + ":*" if address.startswith("tcp://") and address.endswith(":0") else address


def _new_socket(kind: int, max_msg_bytes: int) -> zmq.Socket:
    sock = _context().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    # libzmq drops the connection of a peer that sends a larger frame, before reading it
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    # queue nothing for a peer that is not connected: a dead worker's states must not pile up
    sock.setsockopt(zmq.IMMEDIATE, 1)
    return sock


def _attach(sock: zmq.Socket, address: str, *, bind: bool) -> zmq.Socket:
    try:
        security.apply(sock, address, bind=bind)
        if bind:
            sock.bind(normalize_address(address))
        else:
            sock.connect(address)
    except zmq.ZMQError as e:
        sock.close()
        verb = "bind to" if bind else "connect to"
        hint = " (is another process using it? pick a free port or pass :0)" if bind else ""
        raise OSError(f"cannot {verb} {address}: {e}{hint}") from None
    except security.InsecureBindError:
        sock.close()
        raise
    return sock


def open_socket(kind: int, address: str, *, bind: bool, max_msg_bytes: int = -1) -> zmq.Socket:
    """Create, configure and bind/connect a socket: every socket in Fermium comes from here.
    `max_msg_bytes` (-1: no limit) is the largest frame accepted; ZeroMQ applies it per frame."""
    sock = _new_socket(kind, max_msg_bytes)
    if kind == zmq.PULL:
        sock.setsockopt(zmq.RCVHWM, INBOX_HWM)
    return _attach(sock, address, bind=bind)


class Inbox(Generic[T]):
    """What every inbox shares, ZeroMQ's or the in-process one (common.mp_local): the callbacks,
    and one received message's decoding and handling, where nothing that goes wrong escapes.
    `limits` bounds what is accepted; `errors(reason)` counts each message rejected."""

    def __init__(self, *, name: str, on_message: Callable[[T], None] | None,
                 on_error: Callable[[ProtocolError], None] | None, limits: WireLimits | None,
                 errors: Callable[[str], None] | None):
        self._limits = limits
        self._queue: queue.Queue[T] = queue.Queue()
        self._on_message = on_message or self._queue.put
        self._on_error = on_error or (lambda e: None)
        self._count = errors or (lambda reason: None)
        self._complain = LogLimiter(log, f"{name}: rejected messages")

    def _reject(self, reason: str, fmt: str, *args, exc_info: bool = False) -> None:
        try:
            self._count(reason)
        except Exception:
            log.exception("counting a rejected message failed")
        self._complain(fmt, *args, exc_info=exc_info)

    def _refuse(self, e: ProtocolError) -> None:
        self._reject(e.reason, "rejected a message: %s", e)
        try:
            self._on_error(e)
        except Exception:
            self._reject("handler", "the error handler failed on %s", e, exc_info=True)

    def _handle(self, frames: list) -> None:
        try:
            msg = decode_frames(frames, self._limits)
        except ProtocolError as e:
            self._refuse(e)
            return
        try:
            self._on_message(msg)  # type: ignore[arg-type]
        except Exception:
            self._reject("handler", "handler failed on %s (rid %.40s)", type(msg).__name__, msg.rid, exc_info=True)

    def get(self, timeout: float | None = None) -> T | None:
        """Next message, or None after `timeout` seconds (only when no callback was given)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


class PullQueue(Inbox[T]):
    """A bound PULL inbox. `address` is the real endpoint (a `:0` port is resolved)."""

    def __init__(self, address: str, *, name: str,
                 on_message: Callable[[T], None] | None = None,
                 on_error: Callable[[ProtocolError], None] | None = None,
                 limits: WireLimits | None = None,
                 errors: Callable[[str], None] | None = None):
        super().__init__(name=name, on_message=on_message, on_error=on_error, limits=limits, errors=errors)
        self._sock = open_socket(zmq.PULL, address, bind=True,
                                 max_msg_bytes=limits.frame_bytes if limits else -1)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pull-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._one()
            except zmq.ContextTerminated:
                break
            except Exception:       # the last resort: whatever happened, the inbox goes on
                self._reject("handler", "inbox %s: unexpected failure", self._thread.name, exc_info=True)
        self._sock.close()

    def _one(self) -> None:
        try:
            if not self._sock.poll(POLL_MS):
                self._complain.flush()
                return
            frames = self._sock.recv_multipart(copy=False)
        except zmq.ContextTerminated:
            raise
        except zmq.ZMQError as e:
            self._reject("recv", "cannot receive: %s", e)
            return
        self._handle(frames)

    def close(self, wait: float = 0.0) -> None:
        """Stop the thread, which closes the socket; `wait` seconds for it (tests, shutdown)."""
        self._stop.set()
        if wait:
            self._thread.join(timeout=wait)


class PushQueue(Generic[T]):
    """A PUSH connection to one peer's inbox; `put` never blocks the caller.

    `on_disconnect`, when given, is called once, from the IO thread, when the connection to
    the peer is lost after it was made (the peer died or closed its socket)."""

    def __init__(self, address: str, *, name: str, on_disconnect: Callable[[], None] | None = None):
        self.address = address
        self._name = name
        sock = _new_socket(zmq.PUSH, -1)
        self._monitor: zmq.Socket | None = None
        if on_disconnect is not None:       # watched before connecting, so no event is missed
            self._monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self._monitor.setsockopt(zmq.LINGER, 0)
        try:
            self._sock = _attach(sock, address, bind=False)
        except Exception:
            if self._monitor is not None:
                self._monitor.close()
            raise
        self._on_disconnect = on_disconnect
        self._connected = self._disconnected = False
        self._gone = False          # the last send timed out: until one goes through, do not wait
        self._queue: queue.Queue[list | None] = queue.Queue()
        self._stop = threading.Event()
        self._complain = LogLimiter(log, f"{name}: dropped messages")
        self._thread = threading.Thread(target=self._run, name=f"push-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        idle = MONITOR_POLL_S if self._monitor is not None else None
        try:
            while True:
                try:
                    frames = self._queue.get(timeout=idle)
                except queue.Empty:
                    self._watch()
                    continue
                if frames is None:
                    break
                self._send(frames)
                self._watch()
        finally:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close()
            self._sock.close()

    def _send(self, frames: list) -> None:
        """Send, waiting at most SEND_TIMEOUT_MS for a peer that takes nothing; not at all once
        closing, or while the peer is gone (so a dead peer's messages do not pile up here)."""
        deadline = time.monotonic() + SEND_TIMEOUT_MS / 1000
        while True:
            try:
                self._sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                self._gone = False
                return
            except zmq.Again:
                if self._stop.is_set() or self._gone or time.monotonic() > deadline:
                    self._gone = True
                    self._complain("%s: %s took no message for %d ms; dropped one",
                                   self._name, self.address, SEND_TIMEOUT_MS)
                    return
                self._sock.poll(POLL_MS, zmq.POLLOUT)
                self._watch()
            except zmq.ZMQError as e:
                self._complain("%s: cannot send to %s: %s; dropped one", self._name, self.address, e)
                return

    def _watch(self) -> None:
        if self._monitor is None:
            return
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_CONNECTED:
                self._connected = True
            elif event == zmq.EVENT_DISCONNECTED and self._connected and not self._disconnected:
                self._disconnected = True
                try:
                    self._on_disconnect()  # type: ignore[misc]
                except Exception:
                    log.exception("%s: on_disconnect failed", self._name)

    def put(self, msg: T) -> None:
        frames = encode_message(msg)
        if not self._stop.is_set():
            self._queue.put(frames)

    def close(self, wait: float = 0.0) -> None:
        """Stop: what is queued goes out if the peer takes it at once, then the thread closes the
        socket (LINGER=0). Returns at once; `wait` seconds for the thread (tests, shutdown)."""
        self._stop.set()
        self._queue.put(None)
        if wait:
            self._thread.join(timeout=wait)
