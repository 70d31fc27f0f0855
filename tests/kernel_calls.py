"""The kernels of native/cpu called one at a time from numpy, by the kernel tests: activation
quantization, the dots of each ISA, the DeltaNet head and conv updates, the matvec."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

from native.cpu_lib import ISAS, IsaError, Pool, active_isa, ffi, lib, ptr, select_isa, supported_isas


@contextmanager
def isa_restored(select: str | None = None) -> Iterator[None]:
    """Within the block, ISA `select` is active (if given; a runner may also select one there);
    afterwards, the ISA that was active before."""
    prev = active_isa()
    try:
        if select is not None:
            select_isa(select)
        yield
    finally:
        select_isa(prev)


def runnable_isa_index(isa: str) -> int:
    """The index of an ISA this CPU runs, for the kernels called through one by name."""
    if isa not in supported_isas():
        raise IsaError(f"this CPU cannot run the {isa} kernels")
    return ISAS.index(isa)


def check_type(qtype: int) -> None:
    if not lib.fm_type_supported(int(qtype)):
        raise ValueError(f"no native kernel for GGML type {int(qtype)}")


ACT_ALIGN = 16   # activation rows start here (quants.h: the SSSE3 kernels load them aligned)


def aligned(a: np.ndarray) -> np.ndarray:
    """a, C-contiguous and starting at a multiple of ACT_ALIGN bytes (a copy where it is not)."""
    if a.flags.c_contiguous and a.ctypes.data % ACT_ALIGN == 0:
        return a
    buf = np.empty(a.nbytes + ACT_ALIGN, np.uint8)
    start = -buf.ctypes.data % ACT_ALIGN
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def quantize_act(qtype: int, x: np.ndarray) -> np.ndarray:
    """x: (n,) float32 -> the activation blocks that pair with weights of `qtype` (bytes)."""
    check_type(qtype)
    x = np.ascontiguousarray(x, np.float32)
    block = lib.fm_type_block(int(qtype))
    if x.size % block:
        raise ValueError(f"{x.size} values: the activations of type {int(qtype)} come in whole blocks of {block}")
    out = aligned(np.empty(lib.fm_act_bytes(int(qtype), x.size), np.uint8))
    lib.fm_quantize_act(int(qtype), ptr(x, "float *"), x.size, ptr(out))
    return out


def vec_dot(isa: str, qtype: int, w_row: np.ndarray, act: np.ndarray, n: int) -> float:
    """One weight row (stored blocks) . one prepared activation with the given ISA's kernel."""
    index = runnable_isa_index(isa)
    return float(lib.fm_vec_dot(index, int(qtype), n, ptr(np.ascontiguousarray(w_row)),
                                ptr(aligned(act))))


def gdn_head(isa: str, state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: float,
             beta: float) -> tuple[np.ndarray, np.ndarray]:
    """One Gated DeltaNet value head with the given ISA's kernel: state (dk, dv) -> (new state, o)."""
    index = runnable_isa_index(isa)
    S = np.array(state, dtype=np.float32, order="C")
    q, k, v = (np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v))
    o = np.empty(S.shape[1], np.float32)
    lib.fm_gdn_head_isa(index, ptr(S, "float *"), ptr(q, "float *"), ptr(k, "float *"), ptr(v, "float *"),
                        decay, beta, ptr(o, "float *"), S.shape[0], S.shape[1])
    return S, o


def conv_update(isa: str, state: np.ndarray, w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The conv update of C channels with the given ISA's kernel: state (C, K-1), w (C, K),
    x (C,) -> (SiLU of the taps over [state | x], the state shifted by x)."""
    index = runnable_isa_index(isa)
    S = np.array(state, dtype=np.float32, order="C")
    w, x = (np.ascontiguousarray(a, dtype=np.float32) for a in (w, x))
    out = np.empty(x.size, np.float32)
    lib.fm_conv_update_isa(index, ptr(S, "float *"), ptr(w, "float *"), ptr(x, "float *"),
                           ptr(out, "float *"), x.size, w.shape[1])
    return out, S


def vec_dot_group(isa: str, qtype: int, w_group: np.ndarray, acts: list[np.ndarray], n: int) -> np.ndarray:
    """One group of repacked rows . 1..4 prepared activations -> (len(acts), group)."""
    index = runnable_isa_index(isa)
    acts = [aligned(a) for a in acts]
    out = np.empty((len(acts), lib.fm_type_group(int(qtype))), np.float32)
    ptrs = ffi.new("void *[]", [ptr(a) for a in acts])
    if lib.fm_vec_dot_group(index, int(qtype), n, ptr(np.ascontiguousarray(w_group)), ptrs,
                            len(acts), ptr(out, "float *")):
        raise ValueError(f"type {int(qtype)} is not a repacked layout, or {len(acts)} activations")
    return out


ROWS_AT_ONCE = lib.FM_DOTR_MAX   # the most rows of one call to fm_vec_dot_rows


def has_rows_kernel(isa: str, qtype: int) -> bool:
    """Whether the ISA has a kernel for several rows of a row-layout type at once."""
    return isa in ISAS and bool(lib.fm_has_dot_rows(ISAS.index(isa), int(qtype)))


def vec_dot_rows(isa: str, qtype: int, w_rows: np.ndarray, acts: list[np.ndarray], n: int) -> np.ndarray:
    """1..ROWS_AT_ONCE consecutive rows (rows, row_bytes) . 1..4 prepared activations through
    the ISA's kernel for several rows at once -> (len(acts), rows)."""
    if not has_rows_kernel(isa, qtype):
        raise IsaError(f"the {isa} kernels take GGML type {int(qtype)} row by row")
    w_rows = np.ascontiguousarray(w_rows)
    acts = [aligned(a) for a in acts]
    out = np.empty((len(acts), ROWS_AT_ONCE), np.float32)
    ptrs = ffi.new("void *[]", [ptr(a) for a in acts])
    if lib.fm_vec_dot_rows(ISAS.index(isa), int(qtype), n, ptr(w_rows), w_rows.shape[1], w_rows.shape[0], ptrs,
                           len(acts), ptr(out, "float *")):
        raise ValueError(f"{w_rows.shape[0]} rows or {len(acts)} activations: 1 to {ROWS_AT_ONCE} and 1 to 4")
    return out[:, :w_rows.shape[0]]


def matvec(pool: Pool, qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """w: (rows, row_bytes) stored blocks; x: (B, cols) float32 -> (B, rows)."""
    check_type(qtype)
    if w.shape[0] % lib.fm_type_group(int(qtype)):
        raise ValueError(f"type {int(qtype)} stores rows in groups of {lib.fm_type_group(int(qtype))}: "
                         f"got {w.shape[0]} rows")
    w = np.ascontiguousarray(w)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    lib.fm_matvec(pool.ptr, int(qtype), ptr(w), w.shape[1], w.shape[0], x.shape[1], x.shape[0],
                  ptr(x, "float *"), ptr(y, "float *"))
    return y
