"""One request's life in the router, after validation: admission, dispatch, detokenization,
stop strings, metrics, and cancellation when the client goes away or a stop string matches.

`Generation.run(job)` yields Deltas: text pieces, then one with the finish reason and usage, for
each choice (`Delta.index`); the `n` choices of a request run side by side, one admission slot.
Each carries the prompt tokens served from the prefix cache: the dispatcher's hit, then the
prompt less what prefill reports it prefilled; when the request asks for logprobs, each carries
those of the tokens whose text it carries (ledger.py).
Whatever goes wrong, the admission slot is given back exactly once: when every choice has ended at
the workers (Finished or Failed queued, though the client may not have read it yet), else in run's
`finally` or at a submit that fails.
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
from .dispatch import Dispatcher, Track
from .errors import Busy, DispatchFailed, Drained, GenerationError, NoWorkers, Stalled
from .ledger import Entry, Ledger, entries
from .liveness import StallFailed
from .request import Request

log = logging.getLogger("fermium.router")

MERGE_AHEAD = 16            # Deltas of n > 1 choices merged ahead of the response
REQUEST_TIMEOUT_S = 600.0   # --request-timeout's default


@dataclass(frozen=True)
class Delta:
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    stop_sequence: str | None = None       # the stop string that ended the run, if one did
    index: int = 0                         # the choice, of a request for n > 1
    logprobs: tuple[Entry, ...] = ()       # of the tokens whose text this Delta carries, when asked for


@dataclass
class _Clock:
    """When a request arrived and was dispatched, and when its first token (of any choice) came."""

    arrived: float
    dispatched: float
    first: float | None = None


async def _merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[Delta]:
    """The Deltas of several choices as they come; the first error ends them all. At most MERGE_AHEAD
    wait here, so what a slow client has not taken stays in the choices' bounded Backlogs."""
    queue: asyncio.Queue = asyncio.Queue(MERGE_AHEAD)

    async def pump(stream: AsyncIterator[Delta]) -> None:
        end: Exception | None = None
        try:
            async for d in stream:
                await queue.put(d)
        except Exception as e:
            end = e
        finally:
            await stream.aclose()
        await queue.put(end)                       # not reached when cancelled: nobody reads then

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                left -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _coalesce(msg, events: asyncio.Queue):
    """Tokens already queued behind `msg` join it: one SSE chunk for all, when the router lags."""
    if not isinstance(msg, Tokens):
        return msg
    tokens, logprobs, top_ids, top_logprobs = list(msg.tokens), list(msg.logprobs), list(msg.top_ids), \
        list(msg.top_logprobs)
    while not events.empty() and isinstance(events._queue[0], Tokens):  # type: ignore[attr-defined]
        more = events.get_nowait()
        tokens.extend(more.tokens)
        logprobs.extend(more.logprobs)
        top_ids.extend(more.top_ids)
        top_logprobs.extend(more.top_logprobs)
    if len(tokens) == len(msg.tokens):
        return msg
    return Tokens(msg.rid, tokens, logprobs, top_ids, top_logprobs)


class Generation:
    def __init__(self, tokenizer, dispatcher: Dispatcher, admission: Admission, metrics: RouterMetrics,
                 request_timeout: float = REQUEST_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.request_timeout = request_timeout
        self.dispatcher = dispatcher
        self.admission = admission
        self.metrics = metrics
        self.stop_ids = tuple(sorted(tokenizer.eos_ids))
        self.active: dict[str, Track] = {}       # rid -> Track, of the runs under way
        self._drained: set[str] = set()
        self.closing: str | None = None             # set when the drain time ran out: no new runs

    async def admit(self, n: int = 1) -> float:
        """Wait for slots for `n` sequences; returns the seconds waited. Raises Busy when the queue is full."""
        t0 = time.perf_counter()
        try:
            self.metrics.waiting.set(self.admission.waiting + 1)
            await self.admission.acquire(n)
        except QueueFull as e:
            self.metrics.requests.labels("rejected").inc()
            raise Busy(f"the server is at capacity ({e}); retry shortly") from None
        finally:
            self.metrics.waiting.set(self.admission.waiting)
        self.metrics.running.set(self.admission.running)
        waited = time.perf_counter() - t0
        self.metrics.queue_time.observe(waited)
        return waited

    async def run(self, job: Request, arrived: float) -> AsyncIterator[Delta]:
        """Yields text Deltas and a final one per choice (`index`); the caller has already called admit()."""
        outcome = "cancelled"
        if self.closing:
            self._release("error", job.n)
            raise Drained(self.closing)
        try:
            prefetch = getattr(self.dispatcher.cache, "prefetch", None)   # the disk and shared tiers, off the loop
            if prefetch is not None:
                await prefetch(job.prompt_ids, job.images.marks() if job.images else ())
            room = getattr(self.dispatcher, "room", None)       # decode's capacity (decode_room.py)
            if room is not None:
                await room.reserve(job.n)
            try:
                tracks = ([self.dispatcher.submit(job, self.stop_ids)] if job.n == 1
                          else self.dispatcher.submit_copies(job, self.stop_ids, job.n))
            finally:
                if room is not None:
                    room.settle(job.n)
        except NoWorkers:
            self._release("error", job.n)
            raise
        except asyncio.CancelledError:
            self._release("cancelled", job.n)
            raise
        except Exception as e:
            log.exception("router: dispatching a request failed")
            self._release("error", job.n)
            raise DispatchFailed(f"the request could not be dispatched: {type(e).__name__}: {e}") from None
        for track in tracks:
            self.active[track.rid] = track
        freed = asyncio.ensure_future(self._free_when_ended(tracks))
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        if job.images is not None:
            self.metrics.images.inc(len(job.images.images))
            self.metrics.image_tokens.inc(sum(im.n_tokens for im in job.images.images))
        clock = _Clock(arrived, time.perf_counter())
        follows = [self._follow(job, i, track, clock) for i, track in enumerate(tracks)]
        deltas = follows[0] if len(follows) == 1 else _merge(follows)
        finals = 0
        try:
            async for d in deltas:
                finals += d.finish_reason is not None
                if finals == len(tracks):
                    outcome = d.finish_reason
                yield d
        except Exception:
            outcome = "error"
            raise
        finally:
            await deltas.aclose()
            now = time.perf_counter()
            self.metrics.e2e.observe(now - arrived)
            if clock.first is not None:
                self.metrics.decode_time.observe(now - clock.first)
            early = freed.done() and not freed.cancelled()
            freed.cancel()
            self._release(outcome, job.n, slots=not early)

    async def _free_when_ended(self, tracks: list[Track]) -> None:
        """The slots go back once every choice has ended at the workers: a client still to take the
        tokens holds only their bounded Backlog, and its connection for at most --send-timeout."""
        await asyncio.gather(*(t.events.ended.wait() for t in tracks))
        self._free(len(tracks))

    async def _follow(self, job: Request, index: int, track: Track, clock: _Clock) -> AsyncIterator[Delta]:
        """The Deltas of one choice, from its Track's events; cancels the sequence when it stops early."""
        # decode applies the stop ids and max_tokens, and so never sends a stop token; the same
        # policy here counts what arrives and applies the stop strings, which need the text
        detok, policy = self.tokenizer.stream(), GenerationPolicy(job.max_tokens, self.stop_ids, job.stop)
        last, cached, ended, ledger = None, track.cached, False, Ledger()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.request_timeout):
                        msg = await track.events.get()
                except TimeoutError:
                    raise GenerationError(f"no reply from the workers for {self.request_timeout:.0f} s") from None
                msg = _coalesce(msg, track.events)
                if isinstance(msg, PrefillDone):
                    cached = max(0, len(job.prompt_ids) - msg.n_tokens)
                    continue
                if isinstance(msg, Failed):
                    ended = True
                    raise (Drained if track.rid in self._drained else Stalled if isinstance(msg, StallFailed)
                           else GenerationError)(msg.error)
                if isinstance(msg, Finished):
                    ended = True
                    tail = policy.text(detok.finish()) + policy.flush()
                    stop = policy.stop_reason if isinstance(policy.stop_reason, str) else None
                    ledger.show(len(tail))
                    yield Delta(tail, "stop" if stop is not None else msg.reason, len(job.prompt_ids),
                                max(policy.generated, msg.n_generated), cached, stop, index,
                                ledger.release() if stop is not None else ledger.rest())
                    return
                assert isinstance(msg, Tokens)
                now = time.perf_counter()
                k = len(msg.tokens)
                if clock.first is None:
                    clock.first = now
                    self.metrics.ttft.observe(now - clock.arrived)
                    self.metrics.prefill_time.observe(now - clock.dispatched)
                if last is None:
                    gaps = [0.0] * (k - 1)                  # tokens that came with the first one
                else:
                    gaps = [(now - last) / k] * k
                for gap in gaps:
                    self.metrics.itl.observe(gap)
                last = now
                self.metrics.generation_tokens.inc(len(msg.tokens))
                text = self._text(msg, policy, detok, ledger)
                if isinstance(policy.stop_reason, str):
                    self.dispatcher.cancel(track.rid, "stop string")
                    ended = True
                    yield Delta(text, "stop", len(job.prompt_ids), policy.generated, cached, policy.stop_reason,
                                index, ledger.release())
                    return
                if text:
                    yield Delta(text, cached_tokens=cached, index=index, logprobs=ledger.release())
        finally:
            if not ended:
                self.dispatcher.cancel(track.rid, "client disconnected")
            self.active.pop(track.rid, None)
            self._drained.discard(track.rid)
            self.dispatcher.forget(track.rid)

    @staticmethod
    def _text(msg: Tokens, policy: GenerationPolicy, detok, ledger: Ledger) -> str:
        """The text that msg's tokens let show; the ledger learns where each token's text lies."""
        got, shown = entries(msg), []
        for i, t in enumerate(msg.tokens):
            if not policy.accept(t):
                continue
            piece = detok.push(t)
            shown.append(policy.text(piece))
            if got is not None:
                ledger.token(got[i], len(piece))
                ledger.show(len(shown[-1]))
        return "".join(shown)

    def abort_all(self, why: str) -> int:
        """End every run under way with `why` (a Drained error), and refuse new ones; returns how many."""
        self.closing = why
        for rid, track in self.active.items():
            self._drained.add(rid)
            self.dispatcher.cancel(rid, why)
            track.events.put_nowait(Failed(rid, "router", why))
        return len(self.active)

    def _release(self, outcome: str, n: int, slots: bool = True) -> None:
        self.metrics.requests.labels(outcome).inc()
        if slots:
            self._free(n)

    def _free(self, n: int) -> None:
        self.admission.release(n)
        self.metrics.running.set(self.admission.running)
        self.metrics.waiting.set(self.admission.waiting)

