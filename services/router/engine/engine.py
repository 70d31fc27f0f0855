"""The engine as the frontends see it: everything of the router that is not HTTP, behind one class.

A frontend turns its dialect's request into a Request (request.py) and then:
- `admit(n)`: waits for admission slots for n sequences, or raises Busy when the queue is full;
- `stream(request, arrived)`: runs it, yielding text Deltas and one final Delta per choice
  (generation.py); closing the stream before its end cancels its sequences at the workers;
- `abort_all(why)`: ends every run under way (Drained) and refuses new ones, when the drain ends;
- `health()`: the workers by role, the ones missing, the stalled ones, the admission counts.
Errors are the engine's own (errors.py); each frontend answers them in its dialect. `metrics` and
`tokenizer` are the router's, which the frontends count and render logprobs with.
"""
from __future__ import annotations

import logging
import time
from typing import AsyncIterator

from common.metrics import RouterMetrics

from .admission import Admission
from .dispatch import Dispatcher
from .generation import REQUEST_TIMEOUT_S, Delta, Generation
from .request import Request
from .workers import ROLES

log = logging.getLogger("fermium.router")


class Engine:
    def __init__(self, tokenizer, dispatcher: Dispatcher, admission: Admission, metrics: RouterMetrics,
                 request_timeout: float = REQUEST_TIMEOUT_S):
        self.tokenizer, self.dispatcher, self.admission, self.metrics = tokenizer, dispatcher, admission, metrics
        self._runs = Generation(tokenizer, dispatcher, admission, metrics, request_timeout)

    async def start(self) -> None:
        await self.dispatcher.start()

    async def close(self) -> None:
        await self.dispatcher.close()

    async def admit(self, n: int = 1) -> float:
        """Wait for slots for `n` sequences; the seconds waited. Raises Busy when the queue is full."""
        return await self._runs.admit(n)

    def stream(self, request: Request, arrived: float) -> AsyncIterator[Delta]:
        """The Deltas of an admitted request; raises NoWorkers, DispatchFailed or a GenerationError."""
        return self._runs.run(request, arrived)

    def abort_all(self, why: str) -> int:
        """End every run under way with `why` (a Drained error), and refuse new ones; returns how many."""
        return self._runs.abort_all(why)

    def health(self) -> dict:
        registry = self.dispatcher.registry
        return {"prefill_workers": registry.count("prefill"), "decode_workers": registry.count("decode"),
                "running": self.admission.running, "waiting": self.admission.waiting,
                "workers": [{"id": w.worker_id, "role": w.role, "address": w.address, "inflight": len(w.inflight)}
                            for w in registry.workers.values()],
                "missing": [self._missing(role) for role in ROLES if not registry.count(role)],
                "stalled": self.dispatcher.liveness.report()}

    def _missing(self, role: str) -> dict:
        """A role with no live worker, and the last one of it that died (None: none ever came)."""
        lost = self.dispatcher.registry.lost.get(role)
        if lost is None:
            return {"role": role, "id": None, "address": None, "reason": "no worker has registered"}
        return {"role": role, "id": lost.worker_id, "address": lost.address, "reason": lost.why,
                "seconds_ago": round(time.monotonic() - lost.at, 3)}
