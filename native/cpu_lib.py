"""The compiled CPU kernels (native/cpu, built by cffi at `pip install`), with numpy-friendly
wrappers: ISA choice, the thread pool, activation quantization, dots and matvecs.

The ISA is chosen once at import: the best this CPU supports, or `FERMIUM_ISA`
(generic | ssse3 | avx2 | avx512). `select_isa` switches it later, for tests and benchmarks (`isa_restored` for a block).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from common.errors import UserError

try:
    from native._fermium_cpu import ffi, lib
except ImportError as exc:  # the extension is built by pip, not at import
    raise ImportError(
        "the native CPU kernels are not built; run `pip install -e .` in the repository root "
        f"(it compiles native/cpu with cffi): {exc}") from exc

ISAS = ("generic", "ssse3", "avx2", "avx512")


class IsaError(UserError, RuntimeError):
    """An ISA that is unknown or that this CPU (or OS) cannot run."""


def supported_isas() -> list[str]:
    return [name for i, name in enumerate(ISAS) if lib.fm_isa_supported(i)]


def select_isa(name: str) -> str:
    if name not in ISAS:
        raise IsaError(f"unknown ISA {name!r}; choose one of {', '.join(ISAS)}")
    if lib.fm_isa_select(ISAS.index(name)) != 0:
        raise IsaError(f"this CPU cannot run the {name} kernels; it supports {', '.join(supported_isas())}")
    return name


def active_isa() -> str:
    return ISAS[lib.fm_isa_active()]


@contextmanager
def isa_restored(select: str | None = None) -> Iterator[None]:
    """Within the block, ISA `select` is active (if given; an engine may also select one there);
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


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on (its affinity, e.g.
    systemd's CPUAffinity=); hyper-threads count once."""
    allowed = os.sched_getaffinity(0)
    cores = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        if int(cpu.name[3:]) not in allowed:
            continue
        topo = cpu / "topology"
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            continue
    return len(cores) or len(allowed) or 1


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0")) -> int | None:
    """The largest data or unified cache that a CPU reports in sysfs (its last level, shared by
    the cores that a decode runs on), in bytes; None where sysfs does not say."""
    sizes = []
    for index in cpu.joinpath("cache").glob("index[0-9]*"):
        try:
            if index.joinpath("type").read_text().strip() == "Instruction":
                continue
            text = index.joinpath("size").read_text().strip().upper()
        except OSError:
            continue
        digits = text.rstrip("KMG")   # sysfs writes binary units: 32768K, 300M
        if digits.isdigit():
            sizes.append(int(digits) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1))
    return max(sizes, default=None)


def ram_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Pool:
    """A persistent pthread pool (one thread per physical core unless told otherwise)."""

    def __init__(self, threads: int | None = None):
        self.threads = int(threads) if threads else physical_cores()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.ptr = ffi.gc(lib.fm_pool_new(self.threads), lib.fm_pool_free)


def ptr(a: np.ndarray, ctype: str = "void *"):
    if not a.flags.c_contiguous:
        raise ValueError("native kernels need C-contiguous arrays")
    return ffi.cast(ctype, a.ctypes.data)


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


# repacked layout (quants.h) -> the GGUF type whose bytes it holds, reordered (repack.c): Q4_0 and
# Q4_K in groups of 8 rows (the AVX kernels), Q6_K row by row (every ISA), Q4_0 and Q4_K row by
# row for 128-bit registers (SSSE3)
LAYOUTS = {layout: lib.fm_repack_source(layout)
           for layout in (lib.FM_Q4_0X8, lib.FM_Q4_KX8, lib.FM_Q6_KP, lib.FM_Q4_0P, lib.FM_Q4_KP)}


def repack_group(layout: int) -> int:
    """Rows interleaved in a repacked layout (1: row by row)."""
    return lib.fm_type_group(int(layout))


def repack(layout: int, w: np.ndarray, cols: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows (rows, row_bytes) of the GGUF type that a layout of LAYOUTS holds, in whole groups
    (repack_group) of whole blocks of the layout -> the same bytes in that layout (into `out` when
    given)."""
    if int(layout) not in LAYOUTS:
        raise ValueError(f"type {int(layout)} is not a repacked layout")
    w = np.ascontiguousarray(w)
    out = np.empty_like(w) if out is None else out
    group, block = repack_group(layout), lib.fm_type_block(int(layout))
    if out.nbytes != w.nbytes or w.shape[0] % group or lib.fm_repack(int(layout), ptr(w), w.shape[0], cols, ptr(out)):
        raise ValueError(f"a repack needs rows in groups of {group} and blocks of {block} values: "
                         f"{w.shape[0]} x {cols}")
    return out


def checksum(a: np.ndarray) -> int:
    """fm_checksum of an array's bytes (C-contiguous)."""
    return int(lib.fm_checksum(ptr(a), a.nbytes))


def matvec(pool: Pool, qtype: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """w: (rows, row_bytes) stored blocks; x: (B, cols) float32 -> (B, rows)."""
    check_type(qtype)
    if w.shape[0] % lib.fm_type_group(int(qtype)):
        raise ValueError(f"type {int(qtype)} stores rows in groups of {lib.fm_type_group(int(qtype))}: got {w.shape[0]} rows")
    w = np.ascontiguousarray(w)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    lib.fm_matvec(pool.ptr, int(qtype), ptr(w), w.shape[1], w.shape[0], x.shape[1], x.shape[0],
                  ptr(x, "float *"), ptr(y, "float *"))
    return y


def membw(pool: Pool, nbytes: int = 1 << 30, reps: int = 3) -> float:
    """Measured memory read bandwidth in bytes/s with the pool's threads: the best of reps, each
    a plain and a software-prefetched stream (native/cpu/membw.c)."""
    bw = lib.fm_membw(pool.ptr, nbytes, reps)
    if bw <= 0:
        raise MemoryError(f"could not allocate {nbytes} bytes for the bandwidth measurement")
    return bw


class MemBandwidth:
    """A buffer of `nbytes` for repeated bandwidth measurements with the pool's threads, allocated
    and touched once; measure() streams it as membw() does."""

    def __init__(self, pool: Pool, nbytes: int):
        buf = lib.fm_membw_new(pool.ptr, nbytes)
        if buf == ffi.NULL:
            raise MemoryError(f"could not allocate {nbytes} bytes for the bandwidth measurement")
        # whole 2 MB pages (membw.c)
        self.pool, self.nbytes, self.buf = pool, nbytes // (2 << 20) * (2 << 20), ffi.gc(buf, lib.fm_membw_free)

    def measure(self, reps: int = 1) -> float:
        """Bytes/s: the best of reps, each a plain and a software-prefetched stream."""
        return lib.fm_membw_run(self.pool.ptr, self.buf, reps)

    def faster_stream(self, reps: int = 3) -> bool:
        """Whether the software-prefetched stream is the faster one here: the median of reps
        passes of each kind, taken in turn."""
        plain, ahead = zip(*[(self.stream(False), self.stream(True)) for _ in range(reps)])
        return sorted(ahead)[reps // 2] > sorted(plain)[reps // 2]

    def stream(self, prefetch: bool) -> float:
        """Bytes/s of one pass of the given kind: a single sample, not the best of several."""
        return lib.fm_membw_stream(self.pool.ptr, self.buf, int(prefetch))


_forced = os.environ.get("FERMIUM_ISA")
if _forced:
    select_isa(_forced.strip().lower())

