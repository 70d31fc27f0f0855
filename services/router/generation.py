"""One request's life in the router, after validation: admission, dispatch, detokenization,
stop strings, metrics, and cancellation when the client goes away or a stop string matches.

`Generation.run(job)` yields Deltas: text pieces, then one with the finish reason and usage.
Each carries the prompt tokens served from the prefix cache: the dispatcher's hit, then the
prompt less what prefill reports it prefilled.
Whatever goes wrong, the admission slot is given back exactly once, in run's `finally` or at a
submit that fails.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

from common.generation import GenerationPolicy
from common.metrics import RouterMetrics
from common.protocol.router import Failed, Finished, PrefillDone, Tokens

from .admission import Admission, QueueFull
from .config import RouterConfig
from .dispatch import Dispatcher, NoWorkers, Track
from .errors import RETRY_AFTER_S, APIError, Drained, GenerationError, server_error
from .schema import Job

log = logging.getLogger("fermium.router")


@dataclass(frozen=True)
class Delta:
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    stop_sequence: str | None = None       # the stop string that ended the run, if one did


def _coalesce(msg, events: asyncio.Queue):
    """Tokens already queued behind `msg` join it: one SSE chunk for all, when the router lags."""
    if not isinstance(msg, Tokens):
        return msg
    tokens = list(msg.tokens)
    while not events.empty() and isinstance(events._queue[0], Tokens):  # type: ignore[attr-defined]
        tokens.extend(events.get_nowait().tokens)
    return msg if len(tokens) == len(msg.tokens) else Tokens(msg.rid, msg.worker_id, tokens)


class Generation:
    def __init__(self, tokenizer, dispatcher: Dispatcher, admission: Admission, metrics: RouterMetrics,
                 request_timeout: float = RouterConfig.request_timeout):
        self.tokenizer = tokenizer
        self.request_timeout = request_timeout
        self.dispatcher = dispatcher
        self.admission = admission
        self.metrics = metrics
        self.stop_ids = tuple(sorted(tokenizer.eos_ids))
        self.active: dict[str, Track] = {}       # rid -> Track, of the runs under way
        self._drained: set[str] = set()
        self.closing: str | None = None             # set when the drain time ran out: no new runs

    async def admit(self) -> float:
        """Wait for a slot; returns the seconds waited. Raises APIError 429 when the queue is full."""
        t0 = time.perf_counter()
        try:
            self.metrics.waiting.set(self.admission.waiting + 1)
            await self.admission.acquire()
        except QueueFull as e:
            self.metrics.requests.labels("rejected").inc()
            raise APIError(429, f"the server is at capacity ({e}); retry shortly", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        finally:
            self.metrics.waiting.set(self.admission.waiting)
        self.metrics.running.set(self.admission.running)
        waited = time.perf_counter() - t0
        self.metrics.queue_time.observe(waited)
        return waited

    async def run(self, job: Job, arrived: float) -> AsyncIterator[Delta]:
        """Yields text Deltas and a final one; the caller has already called admit()."""
        outcome = "cancelled"
        if self.closing:
            self._release("error")
            raise APIError(503, self.closing, type="service_unavailable", code="shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            track = self.dispatcher.submit(job, self.stop_ids)
        except NoWorkers as e:
            self._release("error")
            raise APIError(503, str(e), type="service_unavailable", code="no_workers",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except Exception as e:
            log.exception("router: dispatching a request failed")
            self._release("error")
            raise server_error("the request could not be dispatched", e, "dispatch_failed") from None
        self.active[track.rid] = track
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        # decode applies the stop ids and max_tokens, and so never sends a stop token; the same
        # policy here counts what arrives and applies the stop strings, which need the text
        detok, policy = self.tokenizer.stream(), GenerationPolicy(job.max_tokens, self.stop_ids, job.stop)
        dispatched = time.perf_counter()
        first = last = None
        cached = track.cached
        try:
            while True:
                try:
                    async with asyncio.timeout(self.request_timeout):
                        msg = await track.events.get()
                except TimeoutError:
                    outcome = "error"
                    raise GenerationError(f"no reply from the workers for {self.request_timeout:.0f} s") from None
                msg = _coalesce(msg, track.events)
                if isinstance(msg, PrefillDone):
                    cached = max(0, len(job.prompt_ids) - msg.n_tokens)
                    continue
                if isinstance(msg, Failed):
                    outcome = "error"
                    raise (Drained if track.rid in self._drained else GenerationError)(msg.error)
                if isinstance(msg, Finished):
                    tail = policy.text(detok.finish()) + policy.flush()
                    stop = policy.stop_reason if isinstance(policy.stop_reason, str) else None
                    outcome = "stop" if stop is not None else msg.reason
                    yield Delta(tail, outcome, len(job.prompt_ids), max(policy.generated, msg.n_generated), cached,
                                stop)
                    return
                assert isinstance(msg, Tokens)
                now = time.perf_counter()
                k = len(msg.tokens)
                if first is None:
                    first = now
                    self.metrics.ttft.observe(now - arrived)
                    self.metrics.prefill_time.observe(now - dispatched)
                    gaps = [0.0] * (k - 1)                  # tokens that came with the first one
                else:
                    gaps = [(now - last) / k] * k
                for gap in gaps:
                    self.metrics.itl.observe(gap)
                last = now
                self.metrics.generation_tokens.inc(len(msg.tokens))
                text = "".join(policy.text(detok.push(t)) for t in msg.tokens if policy.accept(t))
                if isinstance(policy.stop_reason, str):
                    outcome = "stop"
                    self.dispatcher.cancel(track.rid, "stop string")
                    yield Delta(text, "stop", len(job.prompt_ids), policy.generated, cached, policy.stop_reason)
                    return
                if text:
                    yield Delta(text, cached_tokens=cached)
        finally:
            if outcome == "cancelled":
                self.dispatcher.cancel(track.rid, "client disconnected")
            self.active.pop(track.rid, None)
            self._drained.discard(track.rid)
            self.dispatcher.forget(track.rid)
            now = time.perf_counter()
            self.metrics.e2e.observe(now - arrived)
            if first is not None:
                self.metrics.decode_time.observe(now - first)
            self._release(outcome)

    def abort_all(self, why: str) -> int:
        """End every run under way with `why` (a Drained error), and refuse new ones; returns how many."""
        self.closing = why
        for rid, track in self.active.items():
            self._drained.add(rid)
            self.dispatcher.cancel(rid, why)
            track.events.put_nowait(Failed(rid, "router", why))
        return len(self.active)

    def _release(self, outcome: str) -> None:
        self.metrics.requests.labels(outcome).inc()
        self.admission.release()
        self.metrics.running.set(self.admission.running)
        self.metrics.waiting.set(self.admission.waiting)

