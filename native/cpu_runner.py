"""The CPU runner: the whole decode step (every layer, the LM head) runs in C
(native/cpu/engine.c) on weights read in place from the memory-mapped GGUF.

Same `prefill` / `decode` signatures and `SequenceState` as the reference model, and its
speculative-decoding methods (native/cpu_speculative.py). A prompt with images comes as the
reference's `mm=` (common/reference/multimodal.py): its rows' (T, H, W) rotary positions and the
vision encoder's rows for its image tokens; a state's `rope_delta` moves the rotary position of
the text rows after them. The ISA choice is process-wide (see
native.cpu_lib); `isa=` switches it.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import numpy as np

from common.kv_cache import KV_CODE, check_kv_type, kv_dtype, kv_width
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel, Tensor
from common.model.layers import VECTOR_ROLES, bind
from common.progress import byte_progress
from common.reference.multimodal import MropeInput, mrope_rows
from common.state import SequenceState
from native import cpu_lib
from native.cpu_lib import ffi, lib
from native.cpu_repack import REPACK_LAYOUTS, open_cache, source_ranges
from native.cpu_speculative import SpeculativeMethods
from native.cpu_tables import pointer, same_start, table

KV_GROW = 256   # rows a KV cache grows by at least, so appends are amortised O(1) (without max_context)
# prompt tokens per native prefill chunk. Each weight is read once per chunk; at 8 experts a token,
# a chunk of 256 reaches nearly every expert of a 256-expert layer once, where chunks of 64 read
# most of them four times over (a real-width layer: 0.45 GB of experts).
NATIVE_CHUNK = 256
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


class CpuRunner(SpeculativeMethods):
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
        self._draft = None              # the MTP block's engine (cpu_speculative.py), made on first use
        self.last_bytes = 0.0           # weight bytes read by the last decode step
        # positions a KV buffer is made with (the decode and prefill servers set their context size):
        # it is then never copied to grow; 0: buffers double as they fill
        self.max_context = 0
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

    def _check_kv_type(self, s: SequenceState) -> None:
        if s.kv_type != self.kv_type:
            raise ValueError(f"state KV cache is {s.kv_type} but this runner keeps {self.kv_type}")

    @staticmethod
    def _writable(a: np.ndarray) -> np.ndarray:
        if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable:
            return a
        return np.array(a, np.float32, order="C")

    def _kv_room(self, a: np.ndarray, pos: int, rows: int) -> np.ndarray:
        """A buffer whose first pos rows are `a` and that has rows for positions pos..pos+rows-1:
        (grown, n_kv_heads, kv_width) in the runner's kv_dtype."""
        dtype, width = kv_dtype(self.kv_type), kv_width(self.kv_type, self.cfg.head_dim)
        if a.shape[0] != pos:
            raise ValueError(f"KV cache holds {a.shape[0]} positions but the state is at {pos}")
        if a.dtype != dtype or a.shape[1:] != (self.cfg.n_kv_heads, width):
            raise ValueError(f"a {self.kv_type} KV cache needs {dtype} (pos, {self.cfg.n_kv_heads}, {width}) "
                             f"arrays, got {a.dtype} {a.shape}")
        base = a.base
        if (isinstance(base, np.ndarray) and base.ndim == 3 and base.shape[1:] == a.shape[1:]
                and base.shape[0] >= pos + rows and base.dtype == dtype and base.flags.c_contiguous
                and base.flags.writeable and same_start(base, a)):
            return base
        if self.max_context >= pos + rows:
            grown = self.max_context    # the whole context at once: its pages are touched only as rows are written
        else:                           # doubling: amortised O(1), but each growth copies the cache
            grown = pos + max(KV_GROW, pos, rows)
        buf = np.empty((grown, *a.shape[1:]), dtype)
        buf[:pos] = a
        return buf

    def _seq(self, s: SequenceState, seq, keep: list, rows: int = 1) -> list[np.ndarray]:
        s.conv = [self._writable(a) for a in s.conv]
        s.ssm = [self._writable(a) for a in s.ssm]
        kbufs = [self._kv_room(a, s.pos, rows) for a in s.k]
        vbufs = [self._kv_room(a, s.pos, rows) for a in s.v]
        lists = [table("float", s.conv), table("float", s.ssm), table("void", kbufs), table("void", vbufs)]
        keep += lists
        seq.pos, seq.rope_delta = s.pos, s.rope_delta
        seq.conv, seq.ssm, seq.k, seq.v = lists
        return kbufs, vbufs

    @staticmethod
    def _advance(s: SequenceState, rows: int, kbufs: list[np.ndarray], vbufs: list[np.ndarray]) -> None:
        """The state after the runner wrote `rows` more positions into the buffers of `_seq`."""
        s.pos += rows
        s.k = [buf[:s.pos] for buf in kbufs]
        s.v = [buf[:s.pos] for buf in vbufs]

    def _token_list(self, tokens: Sequence[int]) -> list[int]:
        """_token_ids as Python ints, for the short lists of a decode step (no numpy round trip)."""
        ids = [int(t) for t in tokens]
        if ids and (min(ids) < 0 or max(ids) >= self.cfg.vocab_size):
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        return ids

    def _token_ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        return ids

    # ---- runner contract
    def decode(self, tokens: Sequence[int], states: list[SequenceState]) -> np.ndarray:
        """One token per sequence; advances each state in place. Returns logits (B, vocab)."""
        t0 = time.perf_counter()
        n = len(tokens)
        if n != len(states) or n == 0:
            raise ValueError(f"decode needs one token per state, got {n} tokens for {len(states)} states")
        ids = self._token_list(tokens)
        for s in states:
            self._check_kv_type(s)
        keep: list = []
        seqs = ffi.new("fm_seq[]", n)
        bufs = [self._seq(s, seqs[b], keep) for b, s in enumerate(states)]
        tok = ffi.new("int[]", ids)
        logits = np.empty((n, self.cfg.vocab_size), np.float32)
        t1 = time.perf_counter()
        if lib.fm_decode(self._engine, n, tok, seqs, pointer("float", logits)) != 0:
            raise MemoryError("native decode ran out of scratch memory")
        t2 = time.perf_counter()
        self.last_bytes = lib.fm_engine_bytes(self._engine)
        for s, (kbufs, vbufs) in zip(states, bufs):
            self._advance(s, 1, kbufs, vbufs)
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
        """The prompt through the runner `chunk` tokens at a time (fm_prefill): every weight is
        read once per chunk, the recurrences run token by token. Advances the state in place.
        Returns the last token's logits (vocab,), or every token's (T, vocab). `mm`: the image
        rows and mRoPE positions of a prompt with images (fm_prefill_embd)."""
        ids = self._token_ids(tokens)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        self._check_kv_type(state)
        rope = mrope_rows(self.cfg, self.model.path, mm, ids.size)
        out = np.empty((ids.size if all_logits else 1, self.cfg.vocab_size), np.float32)
        self.last_bytes = 0.0   # the weight bytes of all chunks
        for start in range(0, ids.size, chunk):
            part = ids[start:start + chunk]
            n = part.size
            logit_rows = n if all_logits else (1 if start + n == ids.size else 0)
            dest = out[start:start + n] if all_logits else out
            keep: list = []
            seq = ffi.new("fm_seq *")
            kbufs, vbufs = self._seq(state, seq, keep, rows=n)
            tok = ffi.new("int[]", [int(t) for t in part])
            out_c = ffi.cast("float *", dest.ctypes.data)
            if rope is None:
                err = lib.fm_prefill(self._engine, n, tok, seq, logit_rows, out_c)
            else:
                rows = np.ascontiguousarray(rope[start:start + n])
                seq.mrope = ffi.cast("const int *", rows.ctypes.data)
                mine = (mm.rows >= start) & (mm.rows < start + n)
                at = np.ascontiguousarray(mm.rows[mine] - start, np.int32)
                embd = np.ascontiguousarray(mm.embeds[mine], np.float32)
                keep += [rows, at, embd]
                err = lib.fm_prefill_embd(self._engine, n, tok, seq, int(at.size),
                                          ffi.cast("const int *", at.ctypes.data),
                                          ffi.cast("const float *", embd.ctypes.data), logit_rows, out_c)
            if err != 0:
                raise MemoryError("native prefill ran out of scratch memory")
            self.last_bytes += lib.fm_engine_bytes(self._engine)
            self._advance(state, n, kbufs, vbufs)
        return out if all_logits else out[0]
