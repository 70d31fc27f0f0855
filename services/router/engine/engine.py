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

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, AsyncIterator

from common.metrics import RouterMetrics
from common.state import wire_limits

from .admission import Admission
from .dispatch import Dispatcher
from .generation import REQUEST_TIMEOUT_S, Delta, Generation
from .prefix_cache import PrefixCache, build_snapshot_cache
from .request import Request
from .shared_store import shared_cache, store_key
from .workers import ROLES

if TYPE_CHECKING:                   # the settings module imports the engine's defaults
    from common.model.gguf_file import GGUFModel

    from ..config import RouterConfig

log = logging.getLogger("fermium.router")


class Engine:
    def __init__(self, tokenizer, dispatcher: Dispatcher, admission: Admission, metrics: RouterMetrics,
                 request_timeout: float = REQUEST_TIMEOUT_S):
        self.tokenizer, self.dispatcher, self.admission, self.metrics = tokenizer, dispatcher, admission, metrics
        self._runs = Generation(tokenizer, dispatcher, admission, metrics, request_timeout)

    @classmethod
    def from_config(cls, cfg: RouterConfig, model: GGUFModel, tokenizer, context: int, kv_type: str,
                    cache: PrefixCache | None = None) -> Engine:
        """The engine of `cfg`'s settings: its snapshot cache (unless `cache` is given), dispatcher and
        admission, for `model` at `context` tokens, its KV kept in `kv_type`."""
        metrics = RouterMetrics()
        if cache is None:
            cache = build_snapshot_cache(model.config, metrics, cfg.snapshot_budget, cfg.snapshot_dir,
                                         cfg.snapshot_every, model.fingerprint, kv_type, cfg.snapshot_disk_budget)
            if cache is not None and cfg.snapshot_store:
                cache = shared_cache(cache, cfg.snapshot_store, model.fingerprint, metrics,
                                     store_key(cfg.snapshot_key, cfg.worker_token), cfg.snapshot_store_ca,
                                     cfg.snapshot_store_cert)
            elif cfg.snapshot_store:
                log.warning("--snapshot-store is not used: --snapshot-budget 0 turns snapshots off")
        dispatcher = Dispatcher(cfg.workers, heartbeat_timeout=cfg.heartbeat_timeout, metrics=metrics, cache=cache,
                                token=cfg.worker_token, max_workers=cfg.max_workers, kv_type=kv_type,
                                stall_timeout=cfg.stall_timeout,
                                limits=wire_limits(dataclasses.replace(model.config, context_length=context)))
        return cls(tokenizer, dispatcher, Admission(cfg.max_running, cfg.max_queue), metrics, cfg.request_timeout)

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
