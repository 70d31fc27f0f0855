"""The worker side of the router link, shared by prefill and decode workers.

A worker binds its inbox, says Hello to the router until a HelloAck comes back (the ready
handshake), then sends a Heartbeat with its load every `heartbeat_s` from a thread of its own,
so a long prefill never makes it look dead; it carries the compute loop's step counter too, so
a loop that hangs does look stalled (common.liveness). Both carry its batch `slots` and `hold_budget`, which
the router places requests by, and the worker token (`common.worker_token`):
a worker without the router's token is ignored, and its handshake times out. They also carry
its KV cache type: the router refuses one of a type not its own, saying why in the HelloAck.
Frames that do not decode are logged and, when their request id could be read, answered with
Failed so the request ends instead of hanging. A HelloAck that refuses the worker after it has
registered (the router found its loop stalled) ends the process, for its supervisor to restart.

`WorkerServer` is the base of the prefill and decode servers: the link, metrics, the handshake
at `start`, the message intake and the loop until `stop`, and `run`, which is all of it under
SIGTERM and Ctrl-C.
"""
from __future__ import annotations

import abc
import logging
import queue
import signal
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from typing import Any, Callable, ClassVar

from .config import WorkerConfig
from .kv_cache import DEFAULT_KV_TYPE
from .liveness import StepCounter, exit_stalled, hang_hook
from .log_limit import LogLimiter
from .metrics_host import listen_host
from .mp import PullQueue, PushQueue
from .mp_local import pull_queue, push_queue
from .protocol import Message, ProtocolError
from .protocol.codec import WireLimits
from .protocol.router import Failed, Heartbeat, Hello
from .protocol.worker import Cancel, HelloAck
from .state import wire_limits
from .worker_token import resolve as resolve_token

log = logging.getLogger("fermium.worker")

HEARTBEAT_S = 0.5
BEATS_KEPT = 64            # heartbeats whose answer may still arrive: a refusal must name one
GUARD_PAUSE_S = 0.01       # after a step failed outright: no busy loop if it keeps failing


def reachable(address: str) -> str:
    """A bound wildcard (tcp://0.0.0.0:P) as others can dial it: this host's name."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"):
        if address.startswith(wildcard):
            return f"tcp://{socket.gethostname()}:{address[len(wildcard):]}"
    return address


class CancelledIds:
    """Request ids cancelled lately, remembered for requests that arrive after their Cancel."""

    def __init__(self, memory: int = 4096):
        self.memory, self._ids = memory, OrderedDict()

    def add(self, rid: str) -> None:
        self._ids[rid] = None
        while len(self._ids) > self.memory:
            self._ids.popitem(last=False)

    def __contains__(self, rid: str) -> bool:
        return rid in self._ids


class WorkerLink:
    def __init__(self, role: str, *, router_address: str, inbox_address: str, advertise: str | None,
                 capacity: int, model: str, load: Callable[[], tuple[int, int]],
                 heartbeat_s: float = HEARTBEAT_S, token: str | None = None, kv_type: str = DEFAULT_KV_TYPE,
                 limits: WireLimits | None = None, errors: Callable[[str], None] | None = None,
                 slots: int = 0, hold_budget: int = 0, progress: StepCounter | None = None,
                 on_refused: Callable[[str], None] | None = None):
        self.role, self.capacity, self.model, self.kv_type = role, capacity, model, kv_type
        self.slots, self.hold_budget = slots, hold_budget
        self.token = resolve_token(token)
        self.worker_id = f"{role}-{uuid.uuid4().hex[:8]}"
        self._load = load
        self.progress = progress or StepCounter()
        self._on_refused = on_refused or (lambda reason: exit_stalled(role, reason))
        self._heartbeat_s = heartbeat_s
        self._ack: HelloAck | None = None
        self._acked = threading.Event()
        self._beats: deque[str] = deque(maxlen=BEATS_KEPT)   # rids of the last heartbeats sent
        self._forged = LogLimiter(log, f"{role}: refusals that answer none of its heartbeats")
        self._queue: queue.Queue[Message] = queue.Queue()
        self.inbox: PullQueue[Message] = pull_queue(inbox_address, name=role, on_message=self._route,
                                                   on_error=self._rejected, limits=limits, errors=errors)
        self.address = advertise or reachable(self.inbox.address)
        self.router_address = router_address
        self.router: PushQueue[Message] = push_queue(router_address, name=f"{role}->router")
        self._stop = threading.Event()

    def _route(self, msg: Message) -> None:
        if isinstance(msg, HelloAck):
            if self._acked.is_set() and self._ack.accepted and not msg.accepted:
                # only the router's answer to one of our own heartbeats (random rids) may stop us
                if msg.worker_id == self.worker_id and msg.rid in self._beats:
                    self._on_refused(msg.reason)
                else:
                    self._forged("%s: ignored a refusal (rid %.16s) that answers none of its heartbeats", self.role,
                                 msg.rid)
                return
            self._ack = msg
            self._acked.set()
        else:
            self._queue.put(msg)

    def get(self, timeout: float | None = None) -> Message | None:
        """Next service message (anything but the handshake), or None after `timeout`."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[Message]:
        out = []
        while not self._queue.empty():
            out.append(self._queue.get_nowait())
        return out

    def pending(self) -> int:
        return self._queue.qsize()

    def _rejected(self, err: ProtocolError) -> None:
        if err.rid:                            # the inbox has logged it, at a bounded rate
            self.fail(err.rid, f"{self.role} rejected a message: {err}")

    def fail(self, rid: str, error: str) -> None:
        self.router.put(Failed(rid, self.worker_id, error))

    def send(self, msg: Message) -> None:
        self.router.put(msg)

    def start(self, timeout: float) -> None:
        """Ready handshake: Hello until HelloAck; then heartbeats. Raises with a hint on timeout."""
        hello = Hello(uuid.uuid4().hex, self.worker_id, self.role, self.address, self.capacity, self.model,
                      self.token, self.kv_type, self.slots, self.hold_budget)
        deadline = time.monotonic() + timeout
        while not self._acked.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.role}: the router at {self.router_address} did not answer the ready "
                    f"handshake within {timeout:.0f} s. Start `fermium router` first, or pass its "
                    "worker address with --router (FERMIUM_ROUTER); from another host, --advertise "
                    "must be an address the router can reach, and --worker-token "
                    "(FERMIUM_WORKER_TOKEN) the router's token.")
            self.router.put(hello)
            self._acked.wait(0.25)
        if not self._ack.accepted:
            raise RuntimeError(f"the router refused this {self.role} worker: {self._ack.reason}")
        threading.Thread(target=self._beat, name=f"heartbeat-{self.role}", daemon=True).start()
        log.info("%s %s registered at %s, inbox %s", self.role, self.worker_id, self.router_address, self.address)

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            running, waiting = self._load()
            busy = running + waiting > 0 or self.pending() > 0
            rid = uuid.uuid4().hex
            self._beats.append(rid)
            self.router.put(Heartbeat(rid, self.worker_id, self.role, self.address,
                                      self.capacity, self.model, running, waiting, self.token, self.kv_type,
                                      self.slots, self.hold_budget, self.progress.steps, busy))

    def close(self) -> None:
        self._stop.set()
        self.inbox.close()
        self.router.close(wait=1.0)            # shutdown: what is queued for the router goes first


class WorkerServer(abc.ABC):
    """A worker's life: __init__ binds its inbox, `start` serves metrics and waits for the router's
    ready handshake, `serve_forever` runs `step` until `stop`, `close` lets go of the sockets.

    A subclass sets ROLE and REQUEST (the message type it serves) and implements `load`
    (running, waiting), `receive(request)`, `cancel(rid)` and `step(timeout)`."""

    ROLE: ClassVar[str] = ""
    REQUEST: ClassVar[type] = Message

    def __init__(self, cfg: WorkerConfig, model: Any, metrics: Any, *, capacity: int, limits: WireLimits | None = None,
                 slots: int = 0, hold_budget: int = 0):
        self.cfg, self.model, self.metrics = cfg, model, metrics
        self.log = logging.getLogger(f"fermium.{self.ROLE}")
        self.cancelled = CancelledIds()
        self._complain = LogLimiter(self.log, f"{self.ROLE}: failed requests")
        self._running = True
        self.progress = StepCounter()
        self._hang = hang_hook(self.ROLE)          # None unless a test set common.liveness.HANG_ENV
        self.link = WorkerLink(self.ROLE, router_address=cfg.router, inbox_address=cfg.listen,
                               token=cfg.worker_token, kv_type=cfg.kv_type, advertise=cfg.advertise, capacity=capacity,
                               model=model.path.name, load=self.load, limits=limits or wire_limits(model.config),
                               errors=metrics.protocol_error, slots=slots, hold_budget=hold_budget,
                               progress=self.progress)

    @abc.abstractmethod
    def load(self) -> tuple[int, int]:
        """(running, waiting): the load its heartbeats report."""

    @abc.abstractmethod
    def receive(self, request: Message) -> None:
        """Take one request of REQUEST's type."""

    def cancel(self, rid: str) -> None:
        self.cancelled.add(rid)

    @abc.abstractmethod
    def step(self, timeout: float) -> None:
        """One turn of the compute loop, waiting at most `timeout` s for messages."""

    def start(self) -> None:
        if self.cfg.metrics_port:           # the --listen host is looked up only when metrics are on
            self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host or listen_host(self.cfg.listen))
        self.link.start(self.cfg.ready_timeout)

    def _take(self, timeout: float) -> None:
        """Every queued message: Cancels and requests to the subclass, anything else refused."""
        first = self.link.get(timeout)
        for msg in ([first] if first else []) + self.link.drain():
            if isinstance(msg, Cancel):
                self.cancel(msg.rid)
            elif isinstance(msg, self.REQUEST):
                self.receive(msg)
                if self._hang is not None:
                    self._hang()
            else:
                self.metrics.protocol_error("unexpected")
                self._complain("%s got an unexpected %s (rid %.40s); ignored", self.ROLE, type(msg).__name__, msg.rid)
                self.link.fail(msg.rid, f"{self.ROLE} does not handle {type(msg).__name__}")

    def serve_forever(self) -> None:
        while self._running:
            try:
                self.step()
            except Exception:       # the last resort: log, count, and go on serving
                self.metrics.protocol_error("handler")
                self._complain("%s step failed", self.ROLE, exc_info=True)
                time.sleep(GUARD_PAUSE_S)
            self.progress.advance()

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self.link.close()

    def run(self) -> None:
        """Handshake, then the loop until SIGTERM or Ctrl-C; closed whatever happens. The
        handshake's TimeoutError or RuntimeError (refused) and an OSError pass to the caller."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())
        try:
            self.start()
            self.serve_forever()
        finally:
            self.close()
