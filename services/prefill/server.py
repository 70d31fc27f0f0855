"""The prefill worker: runs prompts through a backend and ships the state to decode.

Loop: take every queued message; Cancels first, then one PrefillRequest at a time:
state (empty, or the snapshot it was given) -> backend.prefill_with_checkpoints (one run over
the weights, the snapshots' states captured on the way) -> DecodeRequest to the decode worker
the router chose, PrefillDone to the router. A request with images (--mmproj) first runs
them through the vision encoder (vision.py); their rows take the image tokens' places, at mRoPE
positions, and the state's rope_delta goes on with the snapshots and to decode. No checkpoint
falls inside an image. Any failure becomes a Failed reply: a request is checked against the
model (common.protocol.checks) before the backend sees it.
States asked to be held (PrefillRequest.hold) are kept in RAM (held.py): the one a request was
sent, its Snapshots, and the final state decode sends back (HoldState, DecodeRequest.hold_at). A
request that names a held state (`held`) starts from it; one that names a state no longer held
is answered NotHeld, and the router sends it again with the bytes.
Connections to decode workers are kept for reuse, at most MAX_DECODERS of them, and one
unused for IDLE_DECODER_S is closed.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

from common.config import ContextModel, plan_context, reserve_context
from common.engine_types import PrefillBackend
from common.engines import create_backend
from common.kv_cache import check_same_kv_type
from common.metrics import PrefillMetrics
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from common.protocol.checks import check_hold, check_prefill
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import HoldState, PrefillRequest
from common.protocol.router import NotHeld, PrefillDone
from common.push_links import PushLinks
from common.reference.multimodal import MropeInput
from common.state import SequenceState, state_bytes, wire_limits
from common.worker import WorkerServer

from .config import PrefillConfig
from .held import HeldStates
from .snapshot_rows import SnapshotRows, snapshot_bytes
from .vision import ImageRows, inside_image, request_rows, segment

log = logging.getLogger("fermium.prefill")
MAX_DECODERS = 8           # decode workers one prefill worker ships to; the least recently used goes
IDLE_DECODER_S = 120.0
PREFILL_STATES = 2         # states held at once: the one being filled and a snapshot's copy on its way out


class PrefillServer(WorkerServer):
    ROLE, REQUEST = "prefill", (PrefillRequest, HoldState)

    def __init__(self, cfg: PrefillConfig, *, model=None, backend: PrefillBackend | None = None):
        """`model` (anything with GGUFModel's .config and .path) and `backend`, when given, are
        used instead of loading cfg.model and cfg.backend: the in-process stack hands in its own."""
        model = model if model is not None else GGUFModel(cfg.model)
        self.memory = plan_context("prefill", model, cfg.ctx_size, PREFILL_STATES, batch_option=None,
                                   kv_type=cfg.kv_type)
        self.ctx_size, self.kv_type = self.memory.tokens, self.memory.kv_type
        self.backend: PrefillBackend = backend if backend is not None else create_backend(
            cfg.backend, model, kv_type=self.kv_type, **cfg.backend_kwargs(self.ctx_size))
        check_same_kv_type(getattr(self.backend, "kv_type", "f32"), self.kv_type, "the backend", "prefill")
        reserve_context(getattr(self.backend, "runner", None), self.ctx_size)
        log.info("prefill: %s", self.memory.describe(PREFILL_STATES))     # once nothing has refused to start
        self.queue: deque[PrefillRequest] = deque()
        self.decoders = PushLinks("prefill", MAX_DECODERS, IDLE_DECODER_S)
        self.busy = 0
        metrics = PrefillMetrics()
        self.vision = ImageRows(cfg.mmproj, metrics=metrics, backend=self.backend) if cfg.mmproj else None
        if self.vision and self.vision.cfg.projection_dim != model.config.hidden_size:
            raise ModelConfigError(f"--mmproj {cfg.mmproj}: the tower projects to {self.vision.cfg.projection_dim}, "
                                   f"the model is {model.config.hidden_size} wide")
        self.held = HeldStates(cfg.held_budget)
        self.rows = SnapshotRows()
        metrics.held_states.set_function(lambda: len(self.held))
        metrics.held_bytes.set_function(lambda: self.held.bytes)
        super().__init__(cfg, ContextModel(model, self.ctx_size), metrics, capacity=1, hold_budget=self.held.budget,
                         limits=wire_limits(model.config, self.vision.cfg if self.vision else None))

    def load(self) -> tuple[int, int]:
        return self.busy, len(self.queue) + self.link.pending()

    def start(self) -> None:
        self._export_stats(self.backend.stats())     # budget and device memory before the first prompt
        super().start()

    def receive(self, msg: PrefillRequest | HoldState) -> None:
        if isinstance(msg, PrefillRequest):
            self.queue.append(msg)
            return
        self.metrics.state_bytes.labels("decode").inc(state_bytes(msg.state))
        try:
            self.held.put(msg.tokens, check_hold(msg, self.model.config, self.kv_type))
        except ValueError as e:
            self.metrics.protocol_error("invalid")
            self._complain("a state from decode (rid %.40s) not kept: %s", msg.rid, e)

    def _take(self, timeout: float) -> None:
        super()._take(timeout)
        self.metrics.waiting.set(len(self.queue))

    def step(self, timeout: float = 0.1) -> None:
        self._take(timeout if not self.queue else 0)
        self.decoders.reap()
        if not self.queue:
            return
        req = self.queue.popleft()
        if req.rid in self.cancelled:
            self.metrics.requests.labels("cancelled").inc()
            return
        req = self._start_state(req)
        if req is None:
            return
        self.busy = 1
        self.metrics.running.set(1)
        try:
            self._run(req)
            self.metrics.requests.labels("ok").inc()
        except Exception as e:
            invalid = isinstance(e, ValueError)              # the request's fault: no traceback
            if invalid:
                self.metrics.protocol_error("invalid")
            self._complain("prefill of %.40s failed: %s: %s", req.rid, type(e).__name__, e, exc_info=not invalid)
            self.metrics.requests.labels("error").inc()
            self.link.fail(req.rid, f"prefill failed: {type(e).__name__}: {e}")
        finally:
            self.busy = 0
            self.metrics.running.set(0)

    def _start_state(self, req: PrefillRequest) -> PrefillRequest | None:
        """`req` with the held state it names as its start state; None, answered NotHeld, when none is held."""
        if not req.held:
            if req.start_state is not None:
                self.metrics.state_bytes.labels("router").inc(state_bytes(req.start_state))
            return req
        held = self.held.get(req.held, req.start_pos)
        self.metrics.held_lookups.labels("hit" if held is not None else "miss").inc()
        if held is None:
            self.link.send(NotHeld(req.rid, self.link.worker_id, req.held))
            return None
        return dataclasses.replace(req, start_state=held.arrays(), rope_delta=held.rope_delta, held="")

    def _hold(self, req: PrefillRequest) -> bool:
        return req.hold and not req.images and self.held.budget > 0

    def _run(self, req: PrefillRequest) -> None:
        state = check_prefill(req, self.model.config, self.kv_type)
        if self._hold(req) and req.start_state is not None:     # checked: the arrays are what it was sent
            self.held.put(req.history[:req.start_pos], SequenceState.from_arrays(
                req.start_pos, list(req.start_state), self.model.config, self.kv_type, req.rope_delta))
        mm = request_rows(self.vision, req.tokens, req.images, req.image_token, state.rope_pos, state.rope_delta)
        self.rows.start(req)
        before = self.backend.stats()
        t0 = time.perf_counter()
        logits = self._prefill_with_snapshots(req, state, mm)
        seconds = time.perf_counter() - t0
        self._export_stats(before)
        self.metrics.weight_passes.observe(self.backend.stats().get("passes", 0) - before.get("passes", 0))
        self.metrics.tokens.inc(len(req.tokens))
        self.metrics.time.observe(seconds)
        out = DecodeRequest(req.rid, state.pos, req.history, req.sampling, req.max_tokens, req.stop_ids,
                            req.return_state, state.arrays(), logits.astype("float32", copy=False), state.kv_type,
                            state.rope_delta, self.link.address if self._hold(req) and req.return_state else "",
                            self.rows.held(req))
        self.metrics.state_bytes_sent.labels("final").inc(state_bytes(out.state) + out.logits.nbytes)
        self.decoders.get(req.decode_address).put(out)
        self.link.send(PrefillDone(req.rid, self.link.worker_id, len(req.tokens), seconds))

    def _prefill_with_snapshots(self, req: PrefillRequest, state: SequenceState, mm: MropeInput | None):
        """Prefill req.tokens in one backend call; with snapshot_every, its checkpoints at the
        multiples of it (those outside an image) and the end of the prompt each go back to the
        router as a Snapshot. The backend counts progress chunk by chunk or pass by pass."""
        every, start, end = req.snapshot_every, state.pos, state.pos + len(req.tokens)
        cuts = [] if every <= 0 else [p for p in range((start // every + 1) * every, end, every)
                                      if not inside_image(mm, p - start)]
        logits, caught = self.backend.prefill_with_checkpoints(list(req.tokens), state, cuts, mm=mm,
                                                               progress=self.progress.advance)
        if mm is not None:
            state.rope_delta = mm.next_pos - state.pos
        if every <= 0:
            return logits
        for c in caught:
            rope_delta = segment(mm, 0, c.pos - start).next_pos - c.pos if mm is not None else state.rope_delta
            self._send_snapshot(req, c.pos, c.state(state, rope_delta), c.logits)
        self._send_snapshot(req, end, state, logits)
        return logits

    def _send_snapshot(self, req: PrefillRequest, pos: int, state: SequenceState, logits) -> None:
        """The state at `pos` to the router as a Snapshot of the KV rows it lacks (snapshot_rows.py),
        and kept whole, when this worker holds states."""
        msg = self.rows.message(req, self.link.worker_id, pos, state, logits)
        self.metrics.state_bytes_sent.labels("snapshot").inc(snapshot_bytes(msg))
        self.link.send(msg)
        if self._hold(req):                 # the message's recurrent copies are never written: shared
            kv = [a[:pos].copy() for a in (*state.k, *state.v)]
            self.held.put(req.history[:pos], SequenceState.from_arrays(pos, [*msg.recurrent, *kv], self.model.config,
                                                                       self.kv_type, state.rope_delta))

    def _export_stats(self, before: dict) -> None:
        after = self.backend.stats()
        moved_key = "h2d_bytes" if "h2d_bytes" in after else "weight_bytes"
        self.metrics.weight_bytes.inc(max(0, after.get(moved_key, 0) - before.get(moved_key, 0)))
        for key, value in after.items():
            if isinstance(value, (int, float)):
                self.metrics.backend_stat.labels(key).set(value)

    def close(self) -> None:
        super().close()
        self.decoders.close()
