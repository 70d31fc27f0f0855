"""Typed ZeroMQ wrappers: one per pattern, each owning its socket, its codec and an IO thread.

- `open_socket` is the one place sockets are created; `common.security` applies CURVE there.
- `PullQueue[T]`: a bound PULL inbox. Its thread decodes frames with `common.protocol` and hands
  each message to a callback or to `get()`. A frame that does not decode is passed to `on_error`
  (logged, never raised into the service loop).
- `PushQueue[T]`: a PUSH connection to one peer. `put()` encodes in the caller (so a bad message
  fails where it was made) and returns; the thread sends, zero-copy for large arrays.

The compute loop of a service never touches a socket: it only calls `get()` and `put()`.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Generic, TypeVar

import zmq

from . import security
from .protocol import Message, ProtocolError, decode_frames, encode_message

T = TypeVar("T", bound=Message)
log = logging.getLogger("fermium.mp")

POLL_MS = 100              # how often IO threads look at their stop flag
SEND_TIMEOUT_MS = 5000     # a peer that takes no message for this long is treated as gone
HWM = 10_000


def _context() -> zmq.Context:
    return zmq.Context.instance()


def normalize_address(address: str) -> str:
    """Accept `tcp://host:0` for "any free port" (ZeroMQ spells it `*`)."""
    return address[:-2] + ":*" if address.startswith("tcp://") and address.endswith(":0") else address


def open_socket(kind: int, address: str, *, bind: bool) -> zmq.Socket:
    """Create, configure and bind/connect a socket: every socket in Fermium comes from here."""
    sock = _context().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    # queue nothing for a peer that is not connected: a dead worker's states must not pile up
    sock.setsockopt(zmq.IMMEDIATE, 1)
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


class PullQueue(Generic[T]):
    """A bound PULL inbox. `address` is the real endpoint (a `:0` port is resolved)."""

    def __init__(self, address: str, *, name: str,
                 on_message: Callable[[T], None] | None = None,
                 on_error: Callable[[ProtocolError], None] | None = None):
        self._sock = open_socket(zmq.PULL, address, bind=True)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._queue: queue.Queue[T] = queue.Queue()
        self._on_message = on_message or self._queue.put
        self._on_error = on_error or (lambda e: log.error("%s: rejected a message: %s", name, e))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pull-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(POLL_MS):
                continue
            frames = self._sock.recv_multipart(copy=False)
            try:
                msg = decode_frames(frames)
            except ProtocolError as e:
                self._on_error(e)
                continue
            try:
                self._on_message(msg)  # type: ignore[arg-type]
            except Exception:
                log.exception("handler failed on %s", type(msg).__name__)
        self._sock.close()

    def get(self, timeout: float | None = None) -> T | None:
        """Next message, or None after `timeout` seconds (only when no callback was given)."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class PushQueue(Generic[T]):
    """A PUSH connection to one peer's inbox; `put` never blocks the caller."""

    def __init__(self, address: str, *, name: str):
        self.address = address
        self._sock = open_socket(zmq.PUSH, address, bind=False)
        self._queue: queue.Queue[list | None] = queue.Queue()
        self._name = name
        self._thread = threading.Thread(target=self._run, name=f"push-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (frames := self._queue.get()) is not None:
            try:
                self._sock.send_multipart(frames, copy=False)
            except zmq.Again:
                log.error("%s: %s took no message for %d ms; dropped one",
                          self._name, self.address, SEND_TIMEOUT_MS)
        self._sock.close()

    def put(self, msg: T) -> None:
        self._queue.put(encode_message(msg))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2)

