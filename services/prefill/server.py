"""The prefill worker: runs prompts through a backend and ships the state to decode.

Loop: take every queued message; Cancels first, then one PrefillRequest at a time:
state (empty, or the snapshot it was given) -> backend.prefill -> DecodeRequest to the decode
worker the router chose, PrefillDone to the router. Any failure becomes a Failed reply.
"""
from __future__ import annotations

import logging
import time
from collections import deque

from common.metrics import PrefillMetrics
from common.model.gguf_file import GGUFModel
from common.mp import PushQueue
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import PrefillRequest
from common.protocol.router import PrefillDone, Snapshot
from common.protocol.worker import Cancel
from common.state import SequenceState
from common.worker import CancelledIds, WorkerLink

from .backends import create_backend
from .config import PrefillConfig

log = logging.getLogger("fermium.prefill")

class PrefillServer:
    def __init__(self, cfg: PrefillConfig):
        self.cfg = cfg
        self.model = GGUFModel(cfg.model)
        self.backend = create_backend(cfg.backend, self.model, **cfg.backend_options)
        self.metrics = PrefillMetrics()
        self.queue: deque[PrefillRequest] = deque()
        self.cancelled = CancelledIds()
        self.decoders: dict[str, PushQueue] = {}
        self.busy = 0
        self.link = WorkerLink("prefill", router_address=cfg.router, inbox_address=cfg.listen,
                               advertise=cfg.advertise, capacity=1, model=self.model.path.name,
                               load=lambda: (self.busy, len(self.queue) + self.link.pending()))
        self._running = True

    def start(self) -> None:
        self._export_stats(self.backend.stats())     # budget and device memory before the first prompt
        self.metrics.serve(self.cfg.metrics_port)
        self.link.start(self.cfg.ready_timeout)

    def _take(self, timeout: float) -> None:
        first = self.link.get(timeout)
        for msg in ([first] if first else []) + self.link.drain():
            if isinstance(msg, Cancel):
                self.cancelled.add(msg.rid)
            elif isinstance(msg, PrefillRequest):
                self.queue.append(msg)
            else:
                log.error("prefill got an unexpected %s (rid %s); ignored", type(msg).__name__, msg.rid)
                self.link.fail(msg.rid, f"prefill does not handle {type(msg).__name__}")
        self.metrics.waiting.set(len(self.queue))

    def step(self, timeout: float = 0.1) -> None:
        self._take(timeout if not self.queue else 0)
        if not self.queue:
            return
        req = self.queue.popleft()
        if req.rid in self.cancelled:
            self.metrics.requests.labels("cancelled").inc()
            return
        self.busy = 1
        self.metrics.running.set(1)
        try:
            self._run(req)
            self.metrics.requests.labels("ok").inc()
        except Exception as e:
            log.exception("prefill of %s failed", req.rid)
            self.metrics.requests.labels("error").inc()
            self.link.fail(req.rid, f"prefill failed: {type(e).__name__}: {e}")
        finally:
            self.busy = 0
            self.metrics.running.set(0)

    def _run(self, req: PrefillRequest) -> None:
        cfg = self.model.config
        if req.start_state is None:
            state = SequenceState.empty(cfg)
        else:
            state = SequenceState.from_arrays(req.start_pos, [a.copy() for a in req.start_state], cfg)
        if not req.tokens:
            raise ValueError("nothing to prefill: the request has no tokens")
        before = self.backend.stats()
        t0 = time.perf_counter()
        logits = self._prefill_with_snapshots(req, state)
        seconds = time.perf_counter() - t0
        self._export_stats(before)
        self.metrics.tokens.inc(len(req.tokens))
        self.metrics.time.observe(seconds)
        out = DecodeRequest(req.rid, state.pos, req.history, req.sampling, req.max_tokens, req.stop_ids,
                            req.return_state, state.arrays(), logits.astype("float32", copy=False))
        self._decoder(req.decode_address).put(out)
        self.link.send(PrefillDone(req.rid, self.link.worker_id, len(req.tokens), seconds))

    def _prefill_with_snapshots(self, req: PrefillRequest, state: SequenceState):
        """Prefill req.tokens; with snapshot_every, in segments ending at its multiples, each one's
        state (and the end of the prompt's) going back to the router as a Snapshot."""
        every, end = req.snapshot_every, state.pos + len(req.tokens)
        if every <= 0:
            return self.backend.prefill(list(req.tokens), state)
        cuts = [p for p in range((state.pos // every + 1) * every, end, every)] + [end]
        done = state.pos
        for cut in cuts:
            logits = self.backend.prefill(list(req.tokens[done - req.start_pos:cut - req.start_pos]), state)
            done = cut
            # copies: the frames leave on the IO thread while the backend may reuse its arrays
            self.link.send(Snapshot(req.rid, self.link.worker_id, cut, [a.copy() for a in state.arrays()],
                                    logits.astype("float32", copy=True)))
        return logits

    def _export_stats(self, before: dict) -> None:
        after = self.backend.stats()
        moved_key = "h2d_bytes" if "h2d_bytes" in after else "weight_bytes"
        self.metrics.weight_bytes.inc(max(0, after.get(moved_key, 0) - before.get(moved_key, 0)))
        for key, value in after.items():
            if isinstance(value, (int, float)):
                self.metrics.backend_stat.labels(key).set(value)

    def _decoder(self, address: str) -> PushQueue:
        if address not in self.decoders:
            self.decoders[address] = PushQueue(address, name=f"prefill->{address}")
        return self.decoders[address]

    def serve_forever(self) -> None:
        while self._running:
            self.step()

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self.link.close()
        for q in self.decoders.values():
            q.close()
