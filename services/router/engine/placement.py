"""Where a prompt is prefilled: by load and by which worker holds the prompt's state (decode
workers are picked by free batch slots: WorkerRegistry.pick). Plain Python, on the event loop.

A prefill worker with a `hold_budget` keeps states in its RAM (services/prefill/held.py), under
the snapshot keys the router files them by (common/snapshots/keys.py prefix_key). `Holdings`
is what the router believes each one holds, learned from what went over the wire: the states a
request sent it, the Snapshots it sent back, and the final states decode sent it (DecodeRequest
.hold_at). A request to a holder names the state (PrefillRequest.held) instead of carrying its
bytes. A belief can be stale (the worker evicted the state, or restarted): the worker answers
NotHeld, and `resend` sends the request again with the bytes, so nothing fails. Prompts with
images are never held: their keys need the images' marks, which the worker does not have.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Iterable

from common.metrics import RouterMetrics
from common.protocol.prefill import PrefillRequest
from common.snapshots import KV_BLOCK
from common.snapshots.keys import prefix_key
from common.state import state_bytes

from .workers import Worker

# a holder may carry this much more load (requests per slot) than the least loaded worker and still win:
# waiting behind one prompt costs less than a state's transfer on the links this is for
HOLDER_SLACK = 1.0
MAX_HOLDINGS = 65_536          # keys remembered; the least recently used go first


def pick_prefill(workers: Iterable[Worker], holders: set[str]) -> tuple[Worker | None, bool]:
    """(worker, holds the state): the least loaded prefill worker, unless one in `holders` is at
    most HOLDER_SLACK more loaded than it, in which case the least loaded holder wins."""
    live = [w for w in workers if w.role == "prefill"]
    if not live:
        return None, False
    order = lambda w: (w.load, len(w.inflight))       # noqa: E731 - one sort key, used twice
    least = min(live, key=order)
    held = [w for w in live if w.worker_id in holders]
    if held:
        best = min(held, key=order)
        if best.load <= least.load + HOLDER_SLACK:
            return best, True
    return least, False


class Holdings:
    """Snapshot key -> the ids of the prefill workers believed to hold that state."""

    def __init__(self, max_keys: int = MAX_HOLDINGS):
        self.max_keys = max_keys
        self._held: OrderedDict[bytes, set[str]] = OrderedDict()

    def add(self, key: bytes, worker_id: str) -> None:
        self._held.setdefault(key, set()).add(worker_id)
        self._held.move_to_end(key)
        while len(self._held) > self.max_keys:
            self._held.popitem(last=False)

    def holders(self, key: bytes) -> set[str]:
        return set(self._held.get(key, ()))

    def drop(self, key: bytes, worker_id: str) -> None:
        held = self._held.get(key)
        if held is not None:
            held.discard(worker_id)
            if not held:
                del self._held[key]


@dataclasses.dataclass
class Plan:
    worker: Worker
    held: str = ""               # the key the request names in place of the state's bytes
    hold: bool = False           # the worker keeps this request's states
    key: bytes = b""             # the start state's snapshot key (text prompts with a state only)


class Placement:
    """The dispatcher's placement: plans, the states sent and skipped, resends."""

    def __init__(self, metrics: RouterMetrics, block: int = KV_BLOCK):
        self.metrics, self.block = metrics, block
        self.holdings = Holdings()
        self._sent: dict[str, tuple[PrefillRequest, list | None]] = {}   # rid -> request, the state it names

    def key(self, ids) -> bytes:
        return prefix_key(list(ids), self.block)

    def plan(self, workers: Iterable[Worker], ids: tuple[int, ...], start: int, state: list | None,
             text_only: bool) -> Plan | None:
        """The prefill worker for a prompt whose snapshot covers ids[:start] (`state`, None: none)."""
        workers = list(workers)
        key = self.key(ids[:start]) if state is not None and text_only else b""
        size = state_bytes(state)
        fits = {w.worker_id for w in workers if w.hold_budget >= size}
        worker, held = pick_prefill(workers, self.holdings.holders(key) & fits if key else set())
        if worker is None:
            return None
        return Plan(worker, key.hex() if held else "", text_only and worker.hold_budget > 0, key)

    def send(self, worker: Worker, req: PrefillRequest, state: list | None, key: bytes = b"") -> None:
        """Put `req` (its state named, or carried) on the worker's link, counting the state's bytes;
        `key`: the state's snapshot key where the plan has it already."""
        if req.held:
            self._sent[req.rid] = (req, state)
        else:
            self.metrics.state_bytes_sent.labels("prefill").inc(state_bytes(state))
            if req.hold and state is not None:               # it keeps what it was sent
                self.holdings.add(key or self.key(req.history[:req.start_pos]), worker.worker_id)
        worker.link.put(req)

    def resend(self, worker: Worker | None, rid: str) -> bool:
        """The request `rid` again, with its state's bytes, to the worker that no longer held it;
        False when there is nothing to resend (it ended, or the worker went away)."""
        sent = self._sent.pop(rid, None)
        if sent is None or worker is None:
            return False
        req, state = sent
        self.holdings.drop(bytes.fromhex(req.held), worker.worker_id)
        self.metrics.state_resends.inc()
        self.send(worker, dataclasses.replace(req, start_state=state, held=""), state)
        return True

    def held_by(self, worker_id: str, ids, pos: int, key: bytes | None = None) -> None:
        """The worker now holds the state after ids[:pos] (`key`: its snapshot key, where known)."""
        self.holdings.add(key or self.key(ids[:pos]), worker_id)

    def done(self, rid: str, prefilled: bool) -> None:
        """The prefill of `rid` ended; `prefilled`: it ran, on the held state it named, if any."""
        sent = self._sent.pop(rid, None)
        if sent is not None and prefilled:
            self.metrics.state_transfers_skipped.inc()
            self.metrics.state_bytes_skipped.inc(state_bytes(sent[1]))
