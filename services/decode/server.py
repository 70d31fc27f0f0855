"""The decode worker: continuous batching over the runner, tokens streamed to the router.

A DecodeRequest brings a prefilled state and the first token's logits. Its first token is
sampled on arrival (that is the time to first token); then the sequence waits for a batch
slot and decodes one token per step with the others. Each token goes to the router
as a Tokens message; the end goes as Finished, with the final state when it was asked for.

A request that fails the model's checks (common.protocol.checks), or whose sampler raises,
fails alone with a Failed reply; a step that raises fails its batch. Nothing a
request brings stops the loop.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from common.metrics import DecodeMetrics
from common.model.gguf_file import GGUFModel
from common.mp import LogLimiter
from common.protocol.checks import check_decode
from common.protocol.decode import DecodeRequest
from common.protocol.router import Finished, Tokens
from common.protocol.worker import Cancel
from common.sampling import Sampler
from common.state import wire_limits
from common.worker import CancelledIds, WorkerLink
from native.runners import load_runner

from .config import DecodeConfig
from .scheduler import BatchScheduler, Sequence

log = logging.getLogger("fermium.decode")
GUARD_PAUSE_S = 0.01       # after a step failed outright: no busy loop if it keeps failing


class DecodeServer:
    def __init__(self, cfg: DecodeConfig):
        self.cfg = cfg
        self.model = GGUFModel(cfg.model)
        self.runner_name, self.runner = load_runner(cfg.runner, self.model)
        self.metrics = DecodeMetrics()
        self.sched = BatchScheduler(cfg.max_batch)
        self.cancelled = CancelledIds()
        self.link = WorkerLink("decode", router_address=cfg.router, inbox_address=cfg.listen,
                               token=cfg.worker_token, advertise=cfg.advertise, capacity=cfg.capacity,
                               model=self.model.path.name,
                               load=lambda: (len(self.sched.running), len(self.sched.waiting)),
                               limits=wire_limits(self.model.config), errors=self.metrics.protocol_error)
        self._complain = LogLimiter(log, "decode: failed requests")
        self._running = True

    def start(self) -> None:
        self.metrics.serve(self.cfg.metrics_port)
        self.link.start(self.cfg.ready_timeout)
        log.info("decode runner: %s, max batch %d", self.runner_name, self.cfg.max_batch)

    # ---- messages
    def _take(self, timeout: float) -> None:
        first = self.link.get(timeout)
        for msg in ([first] if first else []) + self.link.drain():
            if isinstance(msg, Cancel):
                self._cancel(msg.rid)
            elif isinstance(msg, DecodeRequest):
                if msg.rid in self.cancelled:
                    self.metrics.requests.labels("cancelled").inc()
                    continue
                try:
                    self._admit(msg)
                except ValueError as e:                     # the request's fault
                    self.metrics.protocol_error("invalid")
                    self._reject(msg.rid, f"decode rejected the request: {e}")
                except Exception as e:
                    self._reject(msg.rid, f"decode rejected the request: {type(e).__name__}: {e}", trace=True)
            else:
                self.metrics.protocol_error("unexpected")
                self._complain("decode got an unexpected %s (rid %.40s); ignored", type(msg).__name__, msg.rid)
                self.link.fail(msg.rid, f"decode does not handle {type(msg).__name__}")
        self._gauges()

    def _reject(self, rid: str, why: str, *, trace: bool = False) -> None:
        self._complain("%s: %s", rid[:40], why, exc_info=trace)
        self.metrics.requests.labels("error").inc()
        self.link.fail(rid, why)

    def _cancel(self, rid: str) -> None:
        self.cancelled.add(rid)
        seq = self.sched.cancel(rid)
        if seq is not None:
            self._finish(seq, "cancelled", retire=False)

    def _admit(self, req: DecodeRequest) -> None:
        state, params = check_decode(req, self.model.config)
        seq = Sequence(req.rid, state, Sampler(params), list(req.history),
                       req.max_tokens, frozenset(req.stop_ids), req.return_state)
        seq.logits = np.asarray(req.logits)
        if self._accept(seq, seq.sampler.sample(seq.logits, seq.history)):
            self.sched.add(seq)
        else:
            self._finish(seq, seq.finish_reason or "length", retire=False)

    # ---- tokens
    def _accept(self, seq: Sequence, token: int) -> bool:
        """Record a sampled token; False when the sequence is finished."""
        seq.generated += 1
        self.metrics.tokens.inc()
        if token in seq.stop_ids:
            seq.finish_reason = "stop"
            return False
        seq.history.append(token)
        self.link.send(Tokens(seq.rid, self.link.worker_id, [token]))
        if seq.generated >= seq.max_tokens:
            seq.finish_reason = "length"
            return False
        seq.next_token = token
        return True

    def _finish(self, seq: Sequence, reason: str, *, retire: bool = True) -> None:
        if retire:
            self.sched.retire(seq)
        self.metrics.requests.labels(reason).inc()
        keep = seq.return_state and reason != "cancelled"
        state, logits = (seq.state.arrays(), np.asarray(seq.logits, np.float32)) if keep else (None, None)
        self.link.send(Finished(seq.rid, self.link.worker_id, reason, seq.generated, seq.state.pos, state, logits))

    def step(self, timeout: float = 0.05) -> None:
        self._take(timeout if not len(self.sched) else 0)
        self.sched.admit()
        batch = list(self.sched.running)
        if not batch:
            return
        t0 = time.perf_counter()
        try:
            logits = self.runner.decode([s.next_token for s in batch], [s.state for s in batch])
        except Exception as e:
            log.exception("decode step failed for %d sequences", len(batch))
            for seq in batch:
                self.sched.retire(seq)
                self.metrics.requests.labels("error").inc()
                self.link.fail(seq.rid, f"decode step failed: {type(e).__name__}: {e}")
            return
        self.metrics.step_time.observe(time.perf_counter() - t0)
        self.metrics.batch_size.observe(len(batch))
        for seq, row in zip(batch, logits):
            seq.logits = row
            try:
                more = self._accept(seq, seq.sampler.sample(row, seq.history))
            except Exception as e:                          # this sequence's sampler: it alone fails
                self.sched.retire(seq)
                self._reject(seq.rid, f"sampling failed: {type(e).__name__}: {e}", trace=True)
                continue
            if not more:
                self._finish(seq, seq.finish_reason or "length")
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.sched.running))
        self.metrics.waiting.set(len(self.sched.waiting))

    def serve_forever(self) -> None:
        while self._running:
            try:
                self.step()
            except Exception:       # the last resort: log, count, and go on serving
                self.metrics.protocol_error("handler")
                self._complain("decode step failed", exc_info=True)
                time.sleep(GUARD_PAUSE_S)

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self.link.close()
