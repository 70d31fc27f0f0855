"""The `cuda` prefill backend: hand-written Fermi-subset kernels (native/cuda) under pycuda,
with the weights streamed under a VRAM budget from page-locked host memory (native/cuda/staging.py).

A prompt runs layer by layer over all of its tokens, so every streamed weight crosses the bus
once per prompt (once per pass of `pass_tokens` for longer ones), in chunks on a copy stream
that overlap compute (native/cuda/experts.py: which, and when; plan.py: what is resident;
stream.py: the ring of slot regions). The GPU keeps KV in f32: a state's KV goes up
kv_decode'd, and the rows it adds come back kv_encode'd into its kv_type.
A prompt with images (`mm`, common/reference/multimodal.py) differs only on the host: its rows'
rotary table follows their (T, H, W) positions frequency by frequency (the rope kernel reads one
table row per token either way), and the image rows go up over their tokens' embedding rows.
With `mmproj`, the vision tower is placed by cuda_vision.py: on this GPU, its weights and scratch taken
off the VRAM budget, or on the CPU; `vision_encoder(file)` hands the GPU one to the prefill worker.
"""
from __future__ import annotations

import logging
import shutil
import time

import numpy as np

from common.kv_cache import check_same_kv_type
from common.reference.multimodal import MropeInput, mrope_rows, text_input
from common.state import Checkpoint, SequenceState, checkpoint_marks
from native.cuda.checkpoints import CallCheckpoints
from native.cuda.head import LMHead
from native.cuda.layers import F32, LayerRunner
from native.cuda.plan import DEFAULT_BUDGET, layout, parse_size, workspace_bytes
from native.cuda.state_io import HostState, alloc_state, upload_state
from native.cuda.stream import Timeline
from native.cuda.tables import dense_tiles, rope_table

from .cuda_vision import GpuVision, plan_with_vision

log = logging.getLogger("fermium.prefill.cuda")


def _driver():
    import pycuda.driver as cuda
    cuda.init()
    return cuda


class CUDABackend:
    name = "cuda"

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        try:
            cuda = _driver()
        except ImportError as exc:
            return False, f"pycuda is not installed ({exc}); install the `gpu` extra"
        except Exception as exc:
            return False, f"no usable CUDA driver: {exc}"
        if cuda.Device.count() == 0:
            return False, "the CUDA driver reports no device"
        if shutil.which("nvcc") is None:
            return False, "nvcc is not on PATH (it compiles native/cuda at start)"
        return True, f"{cuda.Device.count()} device(s), first: {cuda.Device(0).name()}"

    def __init__(self, model, *, device: int = 0, vram_budget: int | str = DEFAULT_BUDGET,
                 pass_tokens: int = 4096, max_context: int = 8192, regions: int = 8, kv_type: str = "f32",
                 mmproj: str | None = None, vision: str = "auto", staging: str = "auto", phases: bool = False):
        from native.cuda.kernels import Kernels
        from native.cuda.stream import ExpertStreamer
        from native.cuda.weights import DeviceArena, HostExperts, ResidentWeights

        self.cuda = cuda = _driver()
        self.model, self.cfg, self.kv_type = model, model.config, kv_type
        cfg = self.cfg
        self.ctx = cuda.Device(int(device)).make_context()
        try:
            self.plan, placement = plan_with_vision(
                cfg, {n: t.nbytes for n, t in model.tensors.items()}, budget=parse_size(vram_budget),
                mmproj=mmproj, vision=vision, pass_tokens=int(pass_tokens), max_context=int(max_context),
                regions=int(regions))
            for line in self.plan.describe():
                log.info(line)
            self.free_at_start = free0 = cuda.mem_get_info()[0]
            self.kernels = Kernels()
            self.arena = DeviceArena(cuda)
            self.weights = ResidentWeights(cuda, self.arena, model, self.plan)
            self.host = HostExperts(cuda, model, self.plan, staging)    # native/cuda/staging.py
            self.streamer = ExpertStreamer(cuda, self.arena, self.plan, self.host, model)
            offsets, size = layout(workspace_bytes(cfg, self.plan.pass_tokens))
            base = self.arena.alloc("workspace", size)
            self.ws = {ph: {n: base + o for n, o in names.items()} for ph, names in offsets.items()}
            self.state = alloc_state(cfg, self.arena, self.plan.max_context)
            self.compute = cuda.Stream()
            self.timeline = Timeline(cuda)
            P, E = self.plan.pass_tokens, cfg.n_experts
            self.counts_h = self._host(max(E, 1), np.int32)        # (a dense model has no experts)
            self.tables_h = self._host((2, 6 * max(E, 1)), np.int32)     # two expert address tables, int64 [3, E]
            self.embd = model.tensor("token_embd.weight")
            self.embed_h = self._host(P * self.embd.row_bytes, np.uint8)
            self.rope_h = self._host(P * max(cfg.rope_dim, 2), np.float32)
            self.tiles_h = self._host(-(-P // 64) * 4, np.int32)
            self.kv_scratch_h = self._host(HostState.scratch_shape(cfg, P), np.float32)
            self.head = LMHead(cuda, self.kernels, cfg, self.weights, self.ws, self.plan, self.streamer,
                               self.compute, None if self.plan.head_resident else self._head_source())
            self.runner = LayerRunner(cuda, self.kernels, cfg, self.weights, self.streamer, self.ws,
                                      self.state, self.compute, self.timeline,
                                      (self.counts_h, self.tables_h), model, phases)
            self.vision = GpuVision.load(cuda, self.ctx, placement)
            self.device_used_at_start = free0 - cuda.mem_get_info()[0]
            log.info("device memory: %.2f GiB allocated by the backend (peak counted %.2f GiB)",
                     self.device_used_at_start / 2**30, self.arena.peak / 2**30)
        except BaseException:
            if getattr(self, "vision", None) is not None:
                self.vision.free()
            if hasattr(self, "arena"):
                self.arena.free()
            if hasattr(self, "host"):
                self.host.release()
            self.ctx.pop()
            self.ctx.detach()
            raise
        self.ctx.pop()
        self._stats = {"h2d_bytes": 0, "copy_seconds": 0.0, "compute_seconds": 0.0,
                       "wall_seconds": 0.0, "state_io_seconds": 0.0, "routing_wait_seconds": 0.0,
                       "calls": 0, "passes": 0, "tokens": 0, "device_bytes_in_use": 0,
                       "peak_device_bytes": self.arena.peak, "vram_budget_bytes": parse_size(vram_budget),
                       "vision_device_bytes": self.vision.nbytes if self.vision else 0,
                       "pinned_host": int(self.host.pinned), "staged_bytes": self.host.nbytes,
                       "staging_seconds": self.host.seconds}

    def _host(self, shape, dtype) -> np.ndarray:
        """A page-locked host buffer, or a pageable one (logged) when the driver refuses."""
        try:
            return self.cuda.pagelocked_empty(shape, dtype)
        except Exception as exc:                      # locked-memory limit, out of memory
            log.warning("page-locked host buffer refused (%s); using pageable memory", exc)
            return np.empty(shape, dtype)

    def _head_source(self) -> np.ndarray:
        raw = self.weights.head_tensor.raw
        if getattr(self.model, "host_pinned", False) or not self.host.pinned:
            return raw
        buf = self._host(raw.shape, np.uint8)
        np.copyto(buf, raw)
        return buf

    # ------------------------------------------------------------------ prefill
    def prefill(self, tokens, state: SequenceState, *, all_logits: bool = False,
                mm: MropeInput | None = None) -> np.ndarray:
        self.ctx.push()
        try:
            return self._prefill(tokens, state, all_logits, mm, CallCheckpoints(self.cfg, state.pos, []), None)
        finally:
            self.ctx.pop()

    def prefill_with_checkpoints(self, tokens, state: SequenceState, checkpoints, *, mm: MropeInput | None = None,
                                 progress=None) -> tuple[np.ndarray, list[Checkpoint]]:
        """prefill, and the Checkpoint at each of `checkpoints` (positions strictly inside the call,
        increasing), captured within its passes (native/cuda/checkpoints.py): the weights cross
        the bus once per pass whatever the checkpoints. `progress()` is called after each pass."""
        marks = checkpoint_marks(checkpoints, state.pos, len(tokens))
        self.ctx.push()
        try:
            caught = CallCheckpoints(self.cfg, state.pos, marks)
            logits = self._prefill(tokens, state, False, mm, caught, progress)
        finally:
            self.ctx.pop()
        return logits[-1], caught.take(logits[:-1])

    def _rows_of(self, mm: MropeInput | None, state: SequenceState, n: int) -> MropeInput | None:
        if mm is None:
            return text_input(state.pos + state.rope_delta, n) if state.rope_delta else None
        mrope_rows(self.cfg, self.model.path, mm, n)      # the checks the CPU runner makes
        return mm

    def _image_rows(self, mm: MropeInput | None, p0: int, T: int) -> None:
        """The pass's image rows over its embedding rows in keep["x"], one copy per run of rows."""
        if mm is None or not len(mm.rows):
            return
        mine = np.flatnonzero((mm.rows >= p0) & (mm.rows < p0 + T))
        if not mine.size:
            return
        H = self.cfg.hidden_size
        if getattr(self, "image_h", None) is None:
            self.image_h = self._host((self.plan.pass_tokens, H), np.float32)
        # reused by the next pass as embed_h is, once the pass's uploads have landed (_prefill)
        self.image_h[:mine.size] = mm.embeds[mine]
        rows = mm.rows[mine] - p0
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [rows.size]])):
            self.cuda.memcpy_htod_async(self.ws["keep"]["x"] + int(rows[a]) * H * F32, self.image_h[a:b], self.compute)

    def _prefill(self, tokens, state: SequenceState, all_logits: bool, mm: MropeInput | None,
                 caught: CallCheckpoints, progress) -> np.ndarray:
        """The call's logits: every row's with all_logits, else the rows before `caught`'s marks
        and the last one."""
        cuda, cfg, s = self.cuda, self.cfg, self.compute
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("prefill needs a non-empty 1-D token sequence")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        check_same_kv_type(state.kv_type, self.kv_type, "the state", "this backend")
        mm = self._rows_of(mm, state, len(ids))
        pos = state.pos
        if pos + len(ids) > self.plan.max_context:
            raise ValueError(f"context of {pos + len(ids)} tokens exceeds this backend's max_context "
                             f"{self.plan.max_context}")
        h2d0, t0 = self.streamer.h2d_bytes, time.perf_counter()
        wait0 = self.runner.wait_seconds
        upload_state(self.cuda, self.state, state, self.compute)
        self.runner.begin_call()
        out_state = HostState(self.cfg, state, len(ids), self.kv_scratch_h)
        t_up = time.perf_counter()
        H, keep, outs = cfg.hidden_size, self.ws["keep"], []
        uploaded = None
        for p0 in range(0, len(ids), self.plan.pass_tokens):
            chunk = ids[p0:p0 + self.plan.pass_tokens]
            T = len(chunk)
            if uploaded is not None:    # the host buffers below are the last pass's copy sources (an MoE
                uploaded.synchronize()  # layer's routing wait has seen them through already; a dense one's not)
            # raw embedding rows go up in their blocks (through xn) and are widened on the device
            rb = self.embd.row_bytes
            self.embed_h[:T * rb] = self.embd.raw[chunk].reshape(-1)
            cuda.memcpy_htod_async(keep["xn"], self.embed_h[:T * rb], s)
            self.kernels.dequant_rows(s, self.embd.qtype, keep["xn"], rb, 0, keep["x"], T, H)
            self._image_rows(mm, p0, T)
            tiles = dense_tiles(T).reshape(-1)
            self.tiles_h[:tiles.size] = tiles
            cuda.memcpy_htod_async(keep["tiles"], self.tiles_h[:tiles.size], s)
            if cfg.full_layers:
                positions = np.arange(pos, pos + T) if mm is None else mm.rope_pos[:, p0:p0 + T]
                table = rope_table(positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_sections).reshape(-1)
                self.rope_h[:table.size] = table
                cuda.memcpy_htod_async(keep["rope"], self.rope_h[:table.size], s)
            uploaded = cuda.Event()
            uploaded.record(s)
            last = p0 + T >= len(ids)
            self.runner.checkpoints, self.runner.cuts = caught, caught.in_pass(p0, T)
            for i in range(cfg.n_layers):
                self.runner.layer(i, T, pos, out_state.sink(self.runner.slot_of[i], self.state, i, pos, T, last))
                if cfg.is_full_attention(i):
                    self.runner.later(out_state.encoder(self.runner.slot_of[i], pos, T))
            pos += T
            caught.hidden_rows(cuda, self.runner.cuts, keep["x"], s)
            if caught.marks and last:    # one head call for the checkpoints' rows and the last
                caught.hidden_rows(cuda, [(len(caught.marks), T)], keep["x"], s)
                with self.runner.clock("final norm, LM head", flops=2 * len(caught.hidden) * H * cfg.vocab_size):
                    outs.append(self.head.of_host_rows(caught.hidden, keep["x"]))
            elif all_logits or last:
                n = T if all_logits else 1
                with self.runner.clock("final norm, LM head", flops=2 * n * H * cfg.vocab_size):
                    outs.append(self.head(keep["x"] + (T - n) * H * F32, n))
            if progress is not None:
                progress()
        self.runner.checkpoints, self.runner.cuts = None, []
        s.synchronize()
        self.streamer.copy.synchronize()
        t_down = time.perf_counter()
        self.runner.d2h.synchronize()
        self.runner.run_host_work()
        out_state.into(state, pos)
        t_end = time.perf_counter()
        wall = t_end - t0
        self.last_phases = self.runner.clock.take()     # native/cuda/phases.py; None without `phases`
        st = self._stats
        st["h2d_bytes"] += self.streamer.h2d_bytes - h2d0
        st["copy_seconds"] += self.streamer.copies.seconds()
        st["compute_seconds"] += self.timeline.seconds()
        st["wall_seconds"] += wall
        st["state_io_seconds"] += (t_up - t0) + (t_end - t_down)     # not the event sums below
        st["routing_wait_seconds"] += self.runner.wait_seconds - wait0
        st["device_bytes_in_use"] = self.free_at_start - cuda.mem_get_info()[0]
        st["calls"] += 1
        st["passes"] += -(-len(ids) // self.plan.pass_tokens)
        st["tokens"] += len(ids)
        st["peak_device_bytes"] = self.arena.peak
        logits = np.concatenate(outs, axis=0)
        return logits if all_logits or caught.marks else logits[-1]

    def stats(self) -> dict:
        return dict(self._stats)

    def vision_encoder(self, mmproj) -> GpuVision | None:
        """The tower of this MmprojFile on this GPU; None where it runs on the CPU."""
        return self.vision.for_file(mmproj) if self.vision is not None else None

    def close(self) -> None:
        self.ctx.push()
        try:
            if self.vision is not None:
                self.vision.free()
            self.arena.free()
            self.host.release()
        finally:
            self.ctx.pop()
            self.ctx.detach()
