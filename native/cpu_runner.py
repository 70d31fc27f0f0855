"""The CPU runner: the whole decode step (every layer, the LM head) runs in C
(native/cpu/engine.c) on weights read in place from the memory-mapped GGUF.

Same `prefill` / `decode` signatures and `SequenceState` as the reference model, and its
speculative-decoding methods, which call the CpuSpeculative it owns (native/cpu_speculative.py).
A prompt with images comes as the reference's `mm=` (common/reference/multimodal.py): its
rows' (T, H, W) rotary positions and the vision encoder's rows for its image tokens; a state's
`rope_delta` moves the rotary position of the text rows after them. The ISA choice is
process-wide (see native.cpu_lib); `isa=` switches it.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Sequence

import numpy as np

from common.kv_cache import KV_CODE, check_kv_type
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel, Tensor
from common.model.layers import VECTOR_ROLES, bind
from common.progress import byte_progress
from common.reference.multimodal import MropeInput
from common.state import Checkpoint, DraftState, RollbackSlots, SequenceState
from native import cpu_lib
from native.cpu_lib import ffi, lib
from native.cpu_prefill import NATIVE_CHUNK, CpuPrefill
from native.cpu_repack import REPACK_LAYOUTS, open_cache, source_ranges
from native.cpu_rows import StateRows
from native.cpu_speculative import CpuSpeculative
from native.cpu_tables import pointer

PHASES = ("mixer in", "mixer heads", "mixer out", "router", "experts gate/up", "experts down", "LM head",
          "mixer prep", "MoE prep/sum")
PREFAULT_RAM_SHARE = 0.8   # map the whole file up front only when it fits this share of RAM
PROGRESS_BYTES = 2 << 30   # files this large report mapping progress
FFN_CODE = {"moe": 0, "dense": 1}   # ModelConfig.ffn_kind -> fm_model.ffn_kind (engine.c's FFNS)
REPACK_ENV = "FERMIUM_REPACK"   # "0": decode from the GGUF layout, no repack cache

log = logging.getLogger("fermium.decode")


def prefault_weights(model: GGUFModel, skip: list[tuple[int, int]] = ()) -> bool:
    """Map all of the model's pages now (but the `skip` byte ranges), when the file fits in RAM:
    afterwards no decode step stops on a page fault. Logs progress for large files. False when
    skipped."""
    size = model.path.stat().st_size
    ram = cpu_lib.ram_bytes()
    if size > PREFAULT_RAM_SHARE * ram:
        log.info("not mapping %s up front: %.1f GiB against %.1f GiB of RAM", model.path.name,
                 size / 2**30, ram / 2**30)
        return False
    model.file.prefault(byte_progress(log, "mapping weights", PROGRESS_BYTES), skip)
    return True


class CpuRunner:
    def __init__(self, model: GGUFModel, threads: int | None = None, isa: str | None = None,
                 prefault: bool = True, repack: bool | None = None, kv_type: str = "f32"):
        self.bound = bind(model)        # every tensor checked before anything is mapped
        self.kv_type = check_kv_type(kv_type, model.config.head_dim)
        if isa:
            cpu_lib.select_isa(isa)
        self.model = model
        self.isa = cpu_lib.active_isa()
        # the matrices whose repacked layout this ISA reads faster, from a cache file (cpu_repack.py);
        # their pages in the model file are then never touched
        if repack is None:
            repack = os.environ.get(REPACK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
        self.repacked = open_cache(model, REPACK_LAYOUTS[self.isa]) if repack and self.isa in REPACK_LAYOUTS else None
        skip = source_ranges(model, list(self.repacked.views)) if self.repacked else []
        self.prefaulted = prefault and prefault_weights(model, skip)
        self.cfg = model.config
        self.pool = cpu_lib.Pool(threads)
        self.threads = self.pool.threads
        self._alive: list = []          # cffi structs and fp32 vectors the C side points into
        self._model_c = self._describe()
        engine = lib.fm_engine_new(self._model_c, self.pool.ptr)
        if engine == ffi.NULL:
            raise MemoryError("could not allocate the CPU runner's scratch buffers")
        self._engine = ffi.gc(engine, lib.fm_engine_free)
        self.rows = StateRows(self.cfg, self.kv_type)
        self.speculative = CpuSpeculative(self.rows, self._engine, self.bound, model.path, self._weight, self._vector,
                                          self._model_c, self.pool.ptr, self.isa, self.repacked is not None)
        self.prefiller = CpuPrefill(self.rows, self._engine, self.cfg, model.path)
        self.last_bytes = 0.0           # weight bytes read by the last decode step or prefill
        self.last_chunks = 0            # fm_prefill calls (weight passes) of the last prefill
        self.last_seconds = (0.0, 0.0)  # last decode step: (whole call, the C step inside it)

    # ---- model description
    def _weight(self, t: Tensor):
        w = ffi.new("fm_weight *")
        if not lib.fm_type_supported(int(t.qtype)):
            raise ModelConfigError(f"{t.name}: no native kernel for type {t.qtype.name}")
        block = lib.fm_type_block(int(t.qtype))
        if t.shape[-1] % block:
            raise ModelConfigError(f"{t.name}: row length {t.shape[-1]} is not a multiple of the "
                                   f"{t.qtype.name} block ({block})")
        rows, cols = (t.shape[-2], t.shape[-1]) if len(t.shape) > 1 else (1, t.shape[0])
        if self.repacked and t.name in self.repacked.views:
            w.data = ffi.cast("void *", self.repacked.views[t.name].ctypes.data)
            w.type = self.repacked.layouts[t.name]
        else:
            w.data, w.type = ffi.cast("void *", t.raw.ctypes.data), int(t.qtype)
        w.rows, w.cols = rows, cols
        w.row_bytes, w.mat_bytes = t.row_bytes, rows * t.row_bytes
        return w[0]

    def _vector(self, t: Tensor):
        a = np.ascontiguousarray(t.dequant().reshape(-1), np.float32)
        self._alive.append(a)
        return ffi.cast("float *", a.ctypes.data)

    def _describe(self):
        """fm_model from the bound tensors: each role is the fm_layer field of that name; a
        tensor the file lacks (an optional one) stays NULL."""
        cfg, m, bound = self.cfg, ffi.new("fm_model *"), self.bound
        layers = ffi.new("fm_layer[]", cfg.n_layers)
        self._alive += [m, layers]
        for i, tensors in enumerate(bound.layers):
            L = layers[i]
            L.is_full = int(cfg.is_full_attention(i))
            for role, t in tensors.items():
                if t is not None:
                    setattr(L, role, self._vector(t) if role in VECTOR_ROLES else self._weight(t))
        m.hidden, m.vocab, m.n_layers, m.rms_eps = cfg.hidden_size, cfg.vocab_size, cfg.n_layers, cfg.rms_eps
        m.n_heads, m.n_kv_heads, m.head_dim, m.rope_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dim
        m.rope_theta, m.conv_kernel = cfg.rope_theta, cfg.conv_kernel
        m.rope_sections = (list(cfg.rope_sections[:3]) + [0, 0, 0])[:3]
        m.n_k_heads, m.n_v_heads = cfg.n_k_heads, cfg.n_v_heads
        m.head_k_dim, m.head_v_dim = cfg.head_k_dim, cfg.head_v_dim
        m.v_tiled = int(cfg.v_head_layout == "tiled")
        m.n_experts, m.n_experts_used = cfg.n_experts, cfg.n_experts_used
        m.expert_ffn, m.shared_ffn = cfg.expert_ffn, cfg.shared_ffn
        m.ffn_kind, m.dense_ffn = FFN_CODE[cfg.ffn_kind], cfg.dense_ffn
        m.kv_type = KV_CODE[self.kv_type]
        m.embd = self._weight(bound.globals["embd"])
        m.output = self._weight(bound.globals["head"])
        m.out_norm = self._vector(bound.globals["out_norm"])
        m.layers = layers
        return m

    # ---- state plumbing
    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return True, f"native kernels ({cpu_lib.active_isa()})"      # this module imported: they loaded

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.cfg, self.kv_type)

    @property
    def max_context(self) -> int:
        """Positions a KV buffer is made with (cpu_rows.StateRows); the servers set their context size."""
        return self.rows.max_context

    @max_context.setter
    def max_context(self, tokens: int) -> None:
        self.rows.max_context = tokens

    # ---- speculative decoding (cpu_speculative.py), the reference model's contract
    @property
    def has_mtp(self) -> bool:
        return self.speculative.has_mtp

    def new_rollback(self, slots: int) -> RollbackSlots:
        return self.speculative.new_rollback(slots)

    def rollback_bytes(self, slots: int) -> int:
        return self.speculative.rollback_bytes(slots)

    def new_draft_state(self) -> DraftState:
        return self.speculative.new_draft_state()

    def draft_state_bytes(self, positions: int) -> int:
        return self.speculative.draft_state_bytes(positions)

    def verify(self, tokens: list[list[int]], states: list[SequenceState],
               rollbacks: list[RollbackSlots | None]) -> tuple[np.ndarray, np.ndarray]:
        out = self.speculative.verify(tokens, states, rollbacks)
        self.last_bytes = lib.fm_engine_bytes(self._engine)
        return out

    def keep(self, state: SequenceState, rollback: RollbackSlots | None, rows: int, ran: int) -> None:
        self.speculative.keep(state, rollback, rows, ran)

    def set_draft_vocab(self, ids: np.ndarray | None) -> None:
        self.speculative.set_draft_vocab(ids)

    def draft(self, tokens: list[list[int]], hidden: np.ndarray, dstates: list[DraftState],
              last_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return self.speculative.draft(tokens, hidden, dstates, last_only)

    # ---- runner contract
    def decode(self, tokens: Sequence[int], states: list[SequenceState]) -> np.ndarray:
        """One token per sequence; advances each state in place. Returns logits (B, vocab)."""
        t0 = time.perf_counter()
        n = len(tokens)
        if n != len(states) or n == 0:
            raise ValueError(f"decode needs one token per state, got {n} tokens for {len(states)} states")
        ids = self.rows.token_list(tokens)
        for s in states:
            self.rows.check_kv_type(s)
        keep: list = []
        seqs = ffi.new("fm_seq[]", n)
        bufs = [self.rows.seq(s, seqs[b], keep) for b, s in enumerate(states)]
        tok = ffi.new("int[]", ids)
        logits = np.empty((n, self.cfg.vocab_size), np.float32)
        t1 = time.perf_counter()
        if lib.fm_decode(self._engine, n, tok, seqs, pointer("float", logits)) != 0:
            raise MemoryError("native decode ran out of scratch memory")
        t2 = time.perf_counter()
        self.last_bytes = lib.fm_engine_bytes(self._engine)
        for s, (kbufs, vbufs) in zip(states, bufs):
            self.rows.advance(s, 1, kbufs, vbufs)
        self.last_seconds = (time.perf_counter() - t0, t2 - t1)
        return logits

    def last_phases(self) -> dict[str, tuple[float, float]]:
        """The last decode step's phases as {name: (seconds, bytes)}: the matvecs (weight bytes)
        and the mixer heads (state and cache bytes); the stretches around them in the mixers (conv,
        q/k norms, RoPE) and the MoE (routing, SiLU, the experts' sum); and "step", the whole C
        step. What the phases leave is serial: norms, input quantization."""
        assert lib.fm_engine_phase_count() == len(PHASES), "PHASES out of step with engine_impl.h"
        p = ffi.new("double[]", 2 * len(PHASES) + 1)
        lib.fm_engine_phases(self._engine, p)
        out = {name: (p[2 * i], p[2 * i + 1]) for i, name in enumerate(PHASES)}
        out["step"] = (p[2 * len(PHASES)], self.last_bytes)
        return out

    def prefill(self, tokens: Sequence[int], state: SequenceState, *, chunk: int = NATIVE_CHUNK,
                all_logits: bool = False, mm: MropeInput | None = None) -> np.ndarray:
        """The prompt through the runner `chunk` tokens at a time (fm_prefill: every weight read once
        per chunk). Advances the state in place. Returns the last token's logits (vocab,), or every
        token's (T, vocab). `mm`: the image rows and mRoPE positions of a prompt with images."""
        out, _ = self._prefill(tokens, state, (), chunk, all_logits, mm, None)
        return out if all_logits else out[0]

    def prefill_with_checkpoints(self, tokens: Sequence[int], state: SequenceState, checkpoints: Sequence[int], *,
                                 chunk: int = NATIVE_CHUNK, mm: MropeInput | None = None,
                                 progress: Callable[[], None] | None = None) -> tuple[np.ndarray, list[Checkpoint]]:
        """prefill's last logits, and the Checkpoint at each of `checkpoints` (positions strictly
        inside the call, increasing): each bit for bit what a prefill stopping there leaves.
        `progress()` is called after each chunk."""
        out, caught = self._prefill(tokens, state, checkpoints, chunk, False, mm, progress)
        return out[0], caught

    def _prefill(self, tokens, state, checkpoints, chunk, all_logits, mm, progress):
        out = self.prefiller.run(tokens, state, checkpoints, chunk, all_logits, mm, progress)
        self.last_bytes, self.last_chunks = self.prefiller.last_bytes, self.prefiller.last_chunks
        return out
