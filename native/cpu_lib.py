"""The compiled CPU kernels (native/cpu, built by cffi at `pip install`), with numpy-friendly
wrappers: ISA choice, the thread pool, the repacked layouts. tests/kernel_calls.py calls the
dots, matvecs and mixer kernels one by one.

The ISA is chosen once at import: the best this CPU supports, or `FERMIUM_ISA`
(generic | ssse3 | avx2 | avx512 | avx512vbmi). `select_isa` switches it later, for tests and benchmarks.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.kv_cache import KV_CODE, kv_dtype, kv_width

try:
    from native._fermium_cpu import ffi, lib
except ImportError as exc:  # the extension is built by pip, not at import
    raise ImportError(
        "the native CPU kernels are not built; run `pip install -e .` in the repository root "
        f"(it compiles native/cpu with cffi): {exc}") from exc

ISAS = ("generic", "ssse3", "avx2", "avx512", "avx512vbmi")


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


def kv_store(kv_type: str, x: np.ndarray) -> np.ndarray:
    """float32 (..., head_dim) -> the cache's array (..., kv_width) by fm_kv_store, row by row of
    head_dim (common.kv_cache.kv_encode is its reference)."""
    x = np.ascontiguousarray(x, np.float32)
    hd = x.shape[-1]
    width = kv_width(kv_type, hd)
    out = np.empty((*x.shape[:-1], width), kv_dtype(kv_type))
    lib.fm_kv_store(KV_CODE[kv_type], ptr(x, "float *"), ptr(out), x.size)
    return out


def kv_load(kv_type: str, a: np.ndarray, head_dim: int) -> np.ndarray:
    """The cache's array (..., kv_width) -> float32 (..., head_dim) by fm_kv_load."""
    a = np.ascontiguousarray(a, kv_dtype(kv_type))
    out = np.empty((*a.shape[:-1], head_dim), np.float32)
    lib.fm_kv_load(KV_CODE[kv_type], ptr(a), ptr(out, "float *"), out.size)
    return out


def checksum(a: np.ndarray) -> int:
    """fm_checksum of an array's bytes (C-contiguous)."""
    return int(lib.fm_checksum(ptr(a), a.nbytes))


class MemBandwidth:
    """A buffer of `nbytes` for repeated read-bandwidth measurements with the pool's threads,
    allocated and touched once (native/cpu/membw.c)."""

    def __init__(self, pool: Pool, nbytes: int):
        buf = lib.fm_membw_new(pool.ptr, nbytes)
        if buf == ffi.NULL:
            raise MemoryError(f"could not allocate {nbytes} bytes for the bandwidth measurement")
        # whole 2 MB pages (membw.c)
        self.pool, self.nbytes, self.buf = pool, nbytes // (2 << 20) * (2 << 20), ffi.gc(buf, lib.fm_membw_free)

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

