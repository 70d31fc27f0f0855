"""The decode worker: continuous batching over the engine, tokens streamed to the router.

A DecodeRequest brings a prefilled state and the first token's logits. Its first token is
sampled on arrival (that is the time to first token); then the sequence waits for a batch
slot and decodes one token per engine step with the others. Each token goes to the router
as a Tokens message; the end goes as Finished, with the final state when it was asked for.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from common.metrics import DecodeMetrics
from common.model.gguf_file import GGUFModel
from common.protocol.decode import DecodeRequest
from common.protocol.router import Finished, Tokens
from common.protocol.worker import Cancel
from common.sampling import Sampler, SamplingParams
from common.state import SequenceState
from common.worker import CancelledIds, WorkerLink

from .config import DecodeConfig
from .engines import load_engine
from .scheduler import BatchScheduler, Sequence

log = logging.getLogger("fermium.decode")

class DecodeServer:
    def __init__(self, cfg: DecodeConfig):
        self.cfg = cfg
        self.model = GGUFModel(cfg.model)
        self.engine_name, self.engine = load_engine(cfg.engine, self.model)
        self.metrics = DecodeMetrics()
        self.sched = BatchScheduler(cfg.max_batch)
        self.cancelled = CancelledIds()
        self.link = WorkerLink("decode", router_address=cfg.router, inbox_address=cfg.listen,
                               advertise=cfg.advertise, capacity=cfg.capacity, model=self.model.path.name,
                               load=lambda: (len(self.sched.running), len(self.sched.waiting)))
        self._running = True

    def start(self) -> None:
        self.metrics.serve(self.cfg.metrics_port)
        self.link.start(self.cfg.ready_timeout)
        log.info("decode engine: %s, max batch %d", self.engine_name, self.cfg.max_batch)

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
                except Exception as e:
                    log.exception("cannot start decoding %s", msg.rid)
                    self.metrics.requests.labels("error").inc()
                    self.link.fail(msg.rid, f"decode rejected the request: {type(e).__name__}: {e}")
            else:
                log.error("decode got an unexpected %s (rid %s); ignored", type(msg).__name__, msg.rid)
                self.link.fail(msg.rid, f"decode does not handle {type(msg).__name__}")
        self._gauges()

    def _cancel(self, rid: str) -> None:
        self.cancelled.add(rid)
        seq = self.sched.cancel(rid)
        if seq is not None:
            self._finish(seq, "cancelled", retire=False)

    def _admit(self, req: DecodeRequest) -> None:
        state = SequenceState.from_arrays(req.pos, list(req.state), self.model.config)
        if req.logits.shape != (self.model.config.vocab_size,):
            raise ValueError(f"logits shape {req.logits.shape}, vocabulary is {self.model.config.vocab_size}")
        seq = Sequence(req.rid, state, Sampler(SamplingParams(**req.sampling)), list(req.history),
                       req.max_tokens, frozenset(req.stop_ids), req.return_state, joined_at=time.perf_counter())
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
            logits = self.engine.decode([s.next_token for s in batch], [s.state for s in batch])
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
            if not self._accept(seq, seq.sampler.sample(row, seq.history)):
                self._finish(seq, seq.finish_reason or "length")
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.sched.running))
        self.metrics.waiting.set(len(self.sched.waiting))

    def serve_forever(self) -> None:
        while self._running:
            self.step()

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self.link.close()
