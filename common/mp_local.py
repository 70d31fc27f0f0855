"""In-process twins of common.mp's queues, for `local://NAME` addresses: the router and its
workers as threads of one process (fermium.local) run their own code, without sockets.

- `LocalPullQueue` binds NAME in this process; `LocalPushQueue` delivers to the inbox bound
  there. Their constructors, `put`, `get`, `close` and callbacks are PullQueue's and PushQueue's.
- Messages still go through the codec: `put` encodes in the caller (and copies the frames, as a
  socket would), the inbox's thread decodes under its WireLimits, counts and logs what it
  rejects, and hands each message to `on_message` or `get()`.
- A push queue's `on_disconnect` is called once when the inbox it delivers to is closed.
- `pull_queue` / `push_queue` make the twin for a `local://` address, else the ZeroMQ queue.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Generic

from .log_limit import LogLimiter
from .mp import Inbox, PullQueue, PushQueue, T
from .protocol import ProtocolError, encode_message
from .protocol.codec import WireLimits

SCHEME = "local://"
log = logging.getLogger("fermium.mp")

_inboxes: dict[str, "LocalPullQueue"] = {}
_lock = threading.Lock()


def is_local(address: str) -> bool:
    return address.startswith(SCHEME)


class LocalPullQueue(Inbox[T]):
    """A bound in-process inbox; binding a NAME that is bound already raises OSError."""

    def __init__(self, address: str, *, name: str,
                 on_message: Callable[[T], None] | None = None,
                 on_error: Callable[[ProtocolError], None] | None = None,
                 limits: WireLimits | None = None,
                 errors: Callable[[str], None] | None = None):
        super().__init__(name=name, on_message=on_message, on_error=on_error, limits=limits, errors=errors)
        self.address = address
        self._frames: queue.Queue[list | None] = queue.Queue()
        self._watchers: list[Callable[[], None]] = []
        with _lock:
            if address in _inboxes:
                raise OSError(f"cannot bind to {address}: it is bound in this process already")
            _inboxes[address] = self
        self._thread = threading.Thread(target=self._run, name=f"pull-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (frames := self._frames.get()) is not None:
            try:
                self._one(frames)
            except Exception:       # the last resort, as PullQueue's
                self._reject("handler", "inbox %s: unexpected failure", self._thread.name, exc_info=True)

    def _one(self, frames: list) -> None:
        if self._limits and any(len(f) > self._limits.frame_bytes for f in frames):   # as MAXMSGSIZE drops it
            self._refuse(ProtocolError(f"a frame over {self._limits.frame_bytes} bytes", reason="too_large"))
            return
        self._handle(frames)

    def _deliver(self, frames: list) -> None:
        self._frames.put(frames)

    def _watch(self, lost: Callable[[], None]) -> None:
        self._watchers.append(lost)

    def close(self, wait: float = 0.0) -> None:
        with _lock:
            if _inboxes.get(self.address) is not self:
                return
            del _inboxes[self.address]
        self._frames.put(None)
        for lost in self._watchers:
            try:
                lost()
            except Exception:
                log.exception("%s: on_disconnect failed", self.address)
        if wait:
            self._thread.join(timeout=wait)


class LocalPushQueue(Generic[T]):
    """A connection to the in-process inbox bound at `address`; raises OSError when none is."""

    def __init__(self, address: str, *, name: str, on_disconnect: Callable[[], None] | None = None):
        self.address, self._name = address, name
        with _lock:
            self._peer = _inboxes.get(address)
        if self._peer is None:
            raise OSError(f"cannot connect to {address}: nothing in this process is bound there")
        self._closed = False
        self._complain = LogLimiter(log, f"{name}: dropped messages")
        if on_disconnect is not None:
            self._peer._watch(lambda: self._closed or on_disconnect())

    def put(self, msg: T) -> None:
        frames = [bytes(f) for f in encode_message(msg)]
        if self._closed:
            return
        if _inboxes.get(self.address) is not self._peer:
            self._complain("%s: %s is closed; dropped one", self._name, self.address)
            return
        self._peer._deliver(frames)

    def close(self, wait: float = 0.0) -> None:
        self._closed = True


def pull_queue(address: str, **kwargs) -> PullQueue | LocalPullQueue:
    return (LocalPullQueue if is_local(address) else PullQueue)(address, **kwargs)


def push_queue(address: str, **kwargs) -> PushQueue | LocalPushQueue:
    return (LocalPushQueue if is_local(address) else PushQueue)(address, **kwargs)

