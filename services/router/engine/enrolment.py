"""Workers joining the router: the checks a Hello or Heartbeat passes before the registry holds
the worker it names.

Workers are admitted by the worker token in their Hello and Heartbeats: a message without it
is counted and logged (rate-limited) and goes no further, so the router never connects to the
address it names. A worker of another KV cache type than the router's --kv-type is refused with
a HelloAck that says why. A Heartbeat refreshes a known worker's load, slots and hold budget; one
of an unknown worker (the router restarted) registers it again.
"""
from __future__ import annotations

import asyncio
import logging

from common.kv_cache import check_same_kv_type
from common.log_limit import LogLimiter
from common.metrics import RouterMetrics
from common.mp_local import push_queue
from common.protocol.router import Heartbeat, Hello
from common.protocol.worker import HelloAck
from common.worker_token import matches

from .workers import Worker, WorkerRegistry

log = logging.getLogger("fermium.router")

REFUSAL_LINGER_S = 6.0       # a refused worker's link stays this long: past mp's send timeout, so the ack goes out


class Enrolment:
    def __init__(self, registry: WorkerRegistry, metrics: RouterMetrics, token: str, kv_type: str):
        self.registry, self.metrics, self.token, self.kv_type = registry, metrics, token, kv_type
        self._refusals = LogLimiter(log, "router: refused worker registrations")

    def admit(self, msg: Hello | Heartbeat, loop: asyncio.AbstractEventLoop) -> list[Worker] | None:
        """The workers that a newly registered one replaces (a restart at the same address), or
        None when nothing joined: refused, a known worker's heartbeat, a repeated Hello."""
        if not matches(msg.token, self.token):
            self._refuse(msg, "unauthorized", "wrong or missing worker token (--worker-token, FERMIUM_WORKER_TOKEN)")
            return None
        try:
            check_same_kv_type(msg.kv_type, self.kv_type, f"this {msg.role:.20} worker", "the router")
        except ValueError as e:
            self._refuse(msg, "invalid", str(e))
            if isinstance(msg, Hello):         # it has the token: tell it why, so its start fails saying so
                self.refusal_ack(msg, str(e), loop)
            return None
        if isinstance(msg, Heartbeat) and self.registry.heartbeat(msg.worker_id, msg.running, msg.waiting, msg.slots,
                                                                  msg.hold_budget):
            return None
        if msg.worker_id in self.registry.workers:    # a repeated Hello: the ack may have crossed it
            self.registry.workers[msg.worker_id].link.put(HelloAck(msg.rid, msg.worker_id, True, ""))
            return None
        try:
            replaced = self.registry.register(msg.worker_id, msg.role, msg.address, msg.capacity, msg.model,
                                              msg.slots, msg.hold_budget)
        except ValueError as e:
            self._refuse(msg, "invalid", str(e))
            return None
        if isinstance(msg, Hello):
            self.registry.workers[msg.worker_id].link.put(HelloAck(msg.rid, msg.worker_id, True, ""))
        log.info("%s worker %s attached at %s", msg.role, msg.worker_id, msg.address)
        return replaced

    def _refuse(self, msg: Hello | Heartbeat, reason: str, why: str) -> None:
        self.metrics.protocol_error(reason)
        self._refusals("refused a %s of %.40r worker %.40r at %.120r: %s", type(msg).__name__, msg.role,
                       msg.worker_id, msg.address, why)

    def refusal_ack(self, msg: Hello | Heartbeat, why: str, loop: asyncio.AbstractEventLoop) -> None:
        try:
            link = push_queue(msg.address, name=f"router->{msg.address} (refused)")
        except OSError:                        # an in-process address that nothing holds
            return
        link.put(HelloAck(msg.rid, msg.worker_id, False, why))
        loop.call_later(REFUSAL_LINGER_S, link.close)
