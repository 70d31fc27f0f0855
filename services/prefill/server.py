"""The prefill worker: runs prompts through a backend and ships the state to decode.

Loop: take every queued message; Cancels first, then one PrefillRequest at a time:
state (empty, or the snapshot it was given) -> backend.prefill -> DecodeRequest to the decode
worker the router chose, PrefillDone to the router. A request with images (--mmproj) first runs
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
from common.protocol.router import NotHeld, PrefillDone, Snapshot
from common.push_links import PushLinks
from common.reference.multimodal import MropeInput
from common.state import SequenceState, wire_limits
from common.worker import WorkerServer

from .config import PrefillConfig
from .held import HeldStates
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
        self.metrics.state_bytes.labels("decode").inc(sum(a.nbytes for a in msg.state))
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
                self.metrics.state_bytes.labels("router").inc(sum(a.nbytes for a in req.start_state))
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
        before = self.backend.stats()
        t0 = time.perf_counter()
        logits = self._prefill_with_snapshots(req, state, mm)
        seconds = time.perf_counter() - t0
        self._export_stats(before)
        self.metrics.tokens.inc(len(req.tokens))
        self.metrics.time.observe(seconds)
        out = DecodeRequest(req.rid, state.pos, req.history, req.sampling, req.max_tokens, req.stop_ids,
                            req.return_state, state.arrays(), logits.astype("float32", copy=False), state.kv_type,
                            state.rope_delta, self.link.address if self._hold(req) and req.return_state else "")
        self.decoders.get(req.decode_address).put(out)
        self.link.send(PrefillDone(req.rid, self.link.worker_id, len(req.tokens), seconds))

    def _prefill_with_snapshots(self, req: PrefillRequest, state: SequenceState, mm: MropeInput | None):
        """Prefill req.tokens; with snapshot_every, in segments ending at its multiples (those outside
        an image), each one's state (and the end of the prompt's) going back to the router as a Snapshot."""
        every, start, end = req.snapshot_every, req.start_pos, state.pos + len(req.tokens)
        if every <= 0:
            return self._segment(req.tokens, state, mm, 0, len(req.tokens))
        cuts = [p for p in range((state.pos // every + 1) * every, end, every)
                if not inside_image(mm, p - start)] + [end]
        done = state.pos
        for cut in cuts:
            logits = self._segment(req.tokens, state, mm, done - start, cut - start)
            self.progress.advance()        # a long prompt is progress segment by segment (common.liveness)
            done = cut
            self._send_snapshot(req, cut, state, logits)
        return logits

    def _send_snapshot(self, req: PrefillRequest, pos: int, state: SequenceState, logits) -> None:
        """The state at `pos` to the router as a Snapshot (and kept, when this worker holds states)."""
        # copies: the frames leave on the IO thread while the backend may reuse its arrays
        arrays = [a.copy() for a in state.arrays()]
        self.link.send(Snapshot(req.rid, self.link.worker_id, pos, arrays, logits.astype("float32", copy=True),
                                state.kv_type, state.rope_delta))
        if self._hold(req):
            self.held.put(req.history[:pos], SequenceState.from_arrays(pos, arrays, self.model.config,
                                                                       self.kv_type, state.rope_delta))

    def _segment(self, tokens: list[int], state: SequenceState, mm: MropeInput | None, a: int, b: int):
        """tokens[a:b] through the backend (with their rows of `mm`); the state's rope_delta follows."""
        if mm is None:
            return self.backend.prefill(list(tokens[a:b]), state)
        part = segment(mm, a, b)
        logits = self.backend.prefill(list(tokens[a:b]), state, mm=part)
        state.rope_delta = part.next_pos - state.pos
        return logits

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
