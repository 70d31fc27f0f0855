"""The CPU runner's speculative decoding, an object CpuRunner owns and calls: the batched verify
with rollback slots (fm_verify, on the runner's engine), keeping the accepted rows, and the MTP
block's draft step (fm_draft, a second native engine whose model is the block's one layer).

A verify of n rows of a sequence gives the C step row 0 the state's own recurrent arrays and row
j > 0 rollback slot j-1 (each row copies the one before it, then updates its copy); so slot j-1
then holds the state after row j. Rotating the arrays afterwards (no copy) gives the contract's
layout: slot j the state after row j, the state the one after the last row.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from common.kv_cache import kv_dtype, kv_shape, kv_width
from common.model.layers import VECTOR_ROLES
from common.reference.rollback import check_rollback
from common.state import STATE_DTYPE, DraftState, RollbackSlots, SequenceState
from native.cpu_lib import ffi, lib, repack, repack_group
from native.cpu_repack import layouts_for
from native.cpu_rows import KV_GROW, StateRows
from native.cpu_tables import pointer, table

CACHE_LINE = 64   # bytes
NEXTN_ROLES = ("eh_proj", "enorm", "hnorm", "shared_head_norm", "embed_tokens", "shared_head_head")


def _line_aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed STATE_DTYPE array whose data starts at a multiple of CACHE_LINE bytes."""
    nbytes = int(np.prod(shape)) * np.dtype(STATE_DTYPE).itemsize
    buf = np.zeros(nbytes + CACHE_LINE, np.uint8)
    start = -buf.ctypes.data % CACHE_LINE
    return buf[start:start + nbytes].view(STATE_DTYPE).reshape(shape)


class CpuSpeculative:
    """Speculative decoding on a CpuRunner's engine (`engine`) and state rows (`rows`). The draft
    step's engine is built on first use from the MTP block's tensors (`bound.mtp`), described to C
    as the runner describes its own: `weight` and `vector` (CpuRunner._weight, _vector), over the
    trunk's fm_model `trunk` (its widths and KV type), on the runner's pool."""

    def __init__(self, rows: StateRows, engine, bound, path, weight: Callable, vector: Callable, trunk,
                 pool_ptr, isa: str, repacked: bool):
        self.rows, self.cfg, self.kv_type = rows, rows.cfg, rows.kv_type
        self.engine, self.mtp, self.globals, self.path = engine, bound.mtp, bound.globals, path
        self.weight, self.vector, self.trunk, self.pool_ptr = weight, vector, trunk, pool_ptr
        self.isa, self.repacked = isa, repacked
        self._draft = None              # the MTP block's engine, made on first use
        self._alive: list = []          # the draft model's cffi structs, which C points into

    # ---- sizes and new states
    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def _recurrent_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        cfg = self.cfg
        return (cfg.conv_channels, cfg.conv_kernel - 1), (cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim)

    def new_rollback(self, slots: int) -> RollbackSlots:
        """Zeroed slots; each DeltaNet array starts at a cache line, so that the verify's last row
        can stream its state into it (fm_gdn_head_to_isa)."""
        if slots < 0:
            raise ValueError(f"rollback slots must be >= 0, got {slots}")
        conv, ssm = self._recurrent_shapes()
        n_lin = len(self.cfg.linear_layers)
        return RollbackSlots(conv=[[np.zeros(conv, STATE_DTYPE) for _ in range(n_lin)] for _ in range(slots)],
                             ssm=[[_line_aligned_zeros(ssm) for _ in range(n_lin)] for _ in range(slots)])

    def rollback_bytes(self, slots: int) -> int:
        conv, ssm = self._recurrent_shapes()
        per_layer = int(np.prod(conv)) + int(np.prod(ssm))
        return slots * len(self.cfg.linear_layers) * per_layer * np.dtype(STATE_DTYPE).itemsize

    def new_draft_state(self) -> DraftState:
        self._mtp_engine()
        shape = kv_shape(0, self.cfg.n_kv_heads, self.cfg.head_dim, self.kv_type)
        return DraftState(0, np.zeros(shape, kv_dtype(self.kv_type)), np.zeros(shape, kv_dtype(self.kv_type)))

    def draft_state_bytes(self, positions: int) -> int:
        self._mtp_engine()
        shape = kv_shape(positions, self.cfg.n_kv_heads, self.cfg.head_dim, self.kv_type)
        return 2 * int(np.prod(shape)) * kv_dtype(self.kv_type).itemsize

    # ---- verify and keep
    def _slot_arrays(self, arrays: list[np.ndarray], shape: tuple[int, ...], what: str,
                     n_lin: int) -> list[np.ndarray]:
        """The slot's arrays as the C step writes them: float32, C order, writable, the state's shape."""
        if len(arrays) != n_lin:
            raise ValueError(f"a rollback slot's {what} needs {n_lin} arrays, got {len(arrays)}")
        for a in arrays:
            if a.shape != shape:
                raise ValueError(f"a rollback slot's {what} array is {list(a.shape)}, the model needs {list(shape)}")
        return [self.rows.writable(a) for a in arrays]

    def verify(self, tokens: list[list[int]], states: list[SequenceState],
               rollbacks: list[RollbackSlots | None]) -> tuple[np.ndarray, np.ndarray]:
        """Every sequence's tokens in one native step (each weight read once for all rows), each
        from its state's pos. Returns (logits (R, vocab), hidden after output_norm (R, hidden))."""
        if not len(tokens) == len(states) == len(rollbacks) or not tokens:
            raise ValueError("verify: tokens, states and rollbacks differ in length or are empty")
        runs = [len(t) for t in tokens]
        for b, (n, slots) in enumerate(zip(runs, rollbacks)):
            check_rollback(slots, n, b)
        ids = self.rows.token_list([t for seq in tokens for t in seq])
        for s in states:
            self.rows.check_kv_type(s)
        conv_shape, ssm_shape = self._recurrent_shapes()
        R, keep, n_lin = len(ids), [], len(self.cfg.linear_layers)
        rows = ffi.new("fm_seq[]", R)
        bufs, r = [], 0
        for n, s, slots in zip(runs, states, rollbacks):
            bufs.append(self.rows.seq(s, rows[r], keep, rows=n))
            for j in range(1, n):
                conv = slots.conv[j - 1] = self._slot_arrays(slots.conv[j - 1], conv_shape, "conv", n_lin)
                ssm = slots.ssm[j - 1] = self._slot_arrays(slots.ssm[j - 1], ssm_shape, "ssm", n_lin)
                lists = [table("float", conv), table("float", ssm)]
                keep += lists
                row = rows[r + j]
                row.pos, row.k, row.v, row.rope_delta = s.pos + j, rows[r].k, rows[r].v, s.rope_delta
                row.conv, row.ssm = lists
            r += n
        logits = np.empty((R, self.cfg.vocab_size), np.float32)
        hidden = np.empty((R, self.cfg.hidden_size), np.float32)
        err = lib.fm_verify(self.engine, len(runs), ffi.new("int[]", runs), ffi.new("int[]", ids), rows,
                            pointer("float", logits), pointer("float", hidden))
        if err != 0:
            raise MemoryError("native verify ran out of scratch memory")
        for n, s, slots, (kbufs, vbufs) in zip(runs, states, rollbacks, bufs):
            if n > 1:   # state: after row 0, slot j-1: after row j  ->  slot j: after row j, state: after the last
                s.conv, slots.conv[:n - 1] = slots.conv[n - 2], [s.conv, *slots.conv[:n - 2]]
                s.ssm, slots.ssm[:n - 1] = slots.ssm[n - 2], [s.ssm, *slots.ssm[:n - 2]]
            self.rows.advance(s, n, kbufs, vbufs)
        return logits, hidden

    def keep(self, state: SequenceState, rollback: RollbackSlots | None, rows: int, ran: int) -> None:
        """After a verify of `ran` rows, keep the first `rows`: the recurrent arrays of slot rows-1
        swap into the state, and the KV views end at the kept rows (their buffers stay)."""
        if not 1 <= rows <= ran:
            raise ValueError(f"keep: rows must be in [1, {ran}], got {rows}")
        if rows == ran:
            return
        if ran > state.pos:
            raise ValueError(f"keep: the state is at {state.pos}, it cannot have verified {ran} rows")
        if rollback is None or min(len(rollback.conv), len(rollback.ssm)) < rows:
            raise ValueError(f"keep: {rows} of {ran} rows needs rollback slot {rows - 1}")
        state.pos -= ran - rows
        state.k = [a[:state.pos] for a in state.k]
        state.v = [a[:state.pos] for a in state.v]
        slot = rows - 1
        state.conv, rollback.conv[slot] = list(rollback.conv[slot]), state.conv
        state.ssm, rollback.ssm[slot] = list(rollback.ssm[slot]), state.ssm

    # ---- the MTP block
    def _mtp_engine(self):
        """The draft step's engine, built on first use: an fm_model of the block's one layer."""
        if self._draft is not None:
            return self._draft
        mtp = self.mtp
        if mtp is None:
            raise ValueError(f"{self.path}: the model file has no MTP block (nextn), so it cannot draft")
        g = self.globals
        layer = ffi.new("fm_layer *")
        for role, t in mtp.items():
            if t is not None and role not in NEXTN_ROLES:
                setattr(layer, role, self.vector(t) if role in VECTOR_ROLES else self.weight(t))
        layer.is_full = 1
        m = ffi.new("fm_model *", self.trunk[0])   # the trunk's widths and KV type
        m.n_layers, m.layers = 1, layer
        m.embd = self.weight(mtp["embed_tokens"] or g["embd"])
        m.out_norm = self.vector(mtp["shared_head_norm"] or g["out_norm"])
        m.eh_proj = self.weight(mtp["eh_proj"])
        m.enorm, m.hnorm = self.vector(mtp["enorm"]), self.vector(mtp["hnorm"])
        self._draft_head = mtp["shared_head_head"] or g["head"]
        self._draft_full_head = self.weight(self._draft_head)
        m.output = self._draft_full_head
        engine = lib.fm_engine_new(m, self.pool_ptr)
        if engine == ffi.NULL:
            raise MemoryError("could not allocate the draft step's scratch buffers")
        self._alive += [layer, m]
        self._draft_model, self._draft_vocab = m, None
        self._draft = ffi.gc(engine, lib.fm_engine_free)
        return self._draft

    def set_draft_vocab(self, ids: np.ndarray | None) -> None:
        """The draft's LM head over these sorted token ids only (their rows gathered in the GGUF's
        layout into one matrix); None: the whole vocabulary."""
        self._mtp_engine()
        if ids is None:
            self._draft_model.output, self._draft_vocab = self._draft_full_head, None
            return
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError("the draft vocabulary is a non-empty 1-D array of token ids")
        if ids.min() < 0 or ids.max() >= self.cfg.vocab_size or np.any(np.diff(ids) <= 0):
            raise ValueError(f"draft vocabulary ids must be sorted, distinct and in [0, {self.cfg.vocab_size})")
        if self._draft_vocab is not None and np.array_equal(self._draft_vocab[1], ids):
            return   # these rows are gathered already
        t = self._draft_head
        rows = np.ascontiguousarray(np.asarray(t.raw).reshape(self.cfg.vocab_size, t.row_bytes)[ids])
        wtype = int(t.qtype)
        layout = layouts_for(self.isa).get(wtype) if self.repacked else None
        if layout is not None and ids.size % repack_group(layout) == 0 and t.shape[-1] % lib.fm_type_block(layout) == 0:
            rows, wtype = repack(layout, rows, t.shape[-1]), layout   # the layout this ISA reads fastest
        w = ffi.new("fm_weight *")
        w.data, w.type = ffi.cast("void *", rows.ctypes.data), wtype
        w.rows, w.cols = ids.size, self.cfg.hidden_size
        w.row_bytes, w.mat_bytes = t.row_bytes, ids.size * t.row_bytes
        self._draft_model.output = w[0]
        self._draft_vocab = (rows, ids.astype(np.int64))   # the gathered rows stay alive with the model

    def _draft_room(self, a: np.ndarray, pos: int, rows: int) -> np.ndarray:
        """A buffer whose first pos rows are a's and that has rows pos..pos+rows-1 (kv_dtype)."""
        dtype, shape = kv_dtype(self.kv_type), (self.cfg.n_kv_heads, kv_width(self.kv_type, self.cfg.head_dim))
        if a.dtype != dtype or a.shape[1:] != shape or a.shape[0] < pos:
            raise ValueError(f"a draft KV cache at {pos} needs {dtype} (>= {pos}, {shape[0]}, {shape[1]}) arrays, "
                             f"got {a.dtype} {a.shape}")
        if a.shape[0] >= pos + rows and a.flags.c_contiguous and a.flags.writeable:
            return a
        grown = self.rows.max_context if self.rows.max_context >= pos + rows else pos + max(KV_GROW, pos, rows)
        buf = np.empty((grown, *shape), dtype)
        buf[:pos] = a[:pos]
        return buf

    def draft(self, tokens: list[list[int]], hidden: np.ndarray, dstates: list[DraftState],
              last_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The MTP block over every sequence's rows in one native step: row r is (tokens[b][j],
        hidden[r]) at dstates[b].pos + j. Returns (logits (R, V'), hidden_out (R, hidden)); with
        `last_only`, those of each sequence's last row alone (its earlier rows only fill the KV)."""
        engine = self._mtp_engine()
        if len(tokens) != len(dstates):
            raise ValueError("draft: tokens and draft states differ in length")
        ids = self.rows.token_list([t for seq in tokens for t in seq])
        R, H = len(ids), self.cfg.hidden_size
        hidden = np.ascontiguousarray(hidden, np.float32)
        if hidden.shape != (R, H):
            raise ValueError(f"draft: hidden is {list(hidden.shape)}, the rows need [{R}, {H}]")
        vocab = self.cfg.vocab_size if self._draft_vocab is None else self._draft_vocab[1].size
        last, end = [], 0          # each sequence's last row, those with rows
        for seq in tokens:
            end += len(seq)
            if seq:
                last.append(end - 1)
        out = len(last) if last_only else R
        logits = np.empty((out, vocab), np.float32)
        hidden_out = np.empty((out, H), np.float32)
        if R == 0:
            return logits, hidden_out
        rows, keep, r = ffi.new("fm_seq[]", R), [], 0
        empty = ffi.new("float *[]", 1)
        for seq, d in zip(tokens, dstates):
            if not seq:
                continue
            d.k, d.v = self._draft_room(d.k, d.pos, len(seq)), self._draft_room(d.v, d.pos, len(seq))
            k, v = table("void", [d.k]), table("void", [d.v])
            keep += [k, v]
            for j in range(len(seq)):
                rows[r + j].pos, rows[r + j].k, rows[r + j].v = d.pos + j, k, v
                rows[r + j].conv = rows[r + j].ssm = empty
            r += len(seq)
        out_rows = ffi.new("int[]", last) if last_only else ffi.NULL
        err = lib.fm_draft(engine, R, ffi.new("int[]", ids), pointer("float", hidden), rows, out, out_rows,
                           pointer("float", logits), pointer("float", hidden_out))
        if err != 0:
            raise MemoryError("native draft step ran out of scratch memory")
        for seq, d in zip(tokens, dstates):
            d.pos += len(seq)
        return logits, hidden_out
