"""Streamed weights (experts, or the dense FFNs that are not resident) in host memory that the
driver copies from asynchronously (page-locked).

The GGUF mapping itself cannot be registered with the driver, so the bytes are staged once at
start, in one of three ways (the backend's `staging` option picks; `auto` walks the list):
- register: read from the file (os.preadv, not through the mapping's page faults) into
  anonymous memory, which is then registered with the driver (cuMemHostRegister), so that an
  old host does not spend its start in memcpy from the page cache;
- copy: page-locked buffers from the driver (cuMemHostAlloc), filled from the file mapping;
- pageable: the mapping itself, when the driver refuses both; its copies are slower and no
  longer overlap compute. Every step down is logged.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
from contextlib import contextmanager

import numpy as np

from .plan import DENSE_FFN_TENSORS, EXPERT_TENSORS, StreamPlan

log = logging.getLogger("fermium.prefill.cuda")
STAGINGS = ("auto", "register", "copy")
LADDERS = {"auto": ("register", "copy", "pageable"), "register": ("register",), "copy": ("copy", "pageable")}
READ_CHUNK = 1 << 30          # one preadv call stays below Linux's 2 GiB limit per read
REFUSED = {
    "register": "host memory registration refused (%s): staging the streamed experts by copy "
                "into page-locked memory instead",
    "copy": "page-locked host memory refused (%s): streaming experts with pageable copies; "
            "raise `ulimit -l` / LimitMEMLOCK to overlap them",
}


def file_offset(model, raw: np.ndarray) -> int | None:
    """Byte offset in the model's file of a contiguous view into its mapping; None if it is not one."""
    data = getattr(getattr(model, "file", None), "data", None)
    if data is None or not raw.flags.c_contiguous:
        return None
    offset = raw.__array_interface__["data"][0] - data.__array_interface__["data"][0]
    return offset if 0 <= offset and offset + raw.nbytes <= data.nbytes else None


def read_into(fd: int, dst: memoryview, offset: int) -> None:
    """Fill dst with the file's bytes from offset on."""
    done = 0
    while done < len(dst):
        n = os.preadv(fd, [dst[done:done + READ_CHUNK]], offset + done)
        if n <= 0:
            raise OSError(f"the model file ends before byte {offset + len(dst)}")
        done += n


def anonymous(nbytes: int) -> np.ndarray:
    """Whole pages of private anonymous memory, page-aligned as cuMemHostRegister wants: uint8 [pages]."""
    size = max(-(-nbytes // mmap.PAGESIZE), 1) * mmap.PAGESIZE
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), np.uint8)


class _Libcuda:
    """cuMemHostRegister through the driver library, for pycuda: its register_host_memory cannot
    wrap an array that already has a base (NumPy sets a base once; pycuda issue 459)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib = lib

    def check(self, rc: int, call: str) -> None:
        if rc:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{call} failed: {(msg.value or b'unknown error').decode()} (CUresult {rc})")

    def register(self, ary: np.ndarray):
        ptr = ary.__array_interface__["data"][0]
        self.check(self.lib.cuMemHostRegister_v2(ptr, ary.nbytes, 0), "cuMemHostRegister")
        return lambda: self.check(self.lib.cuMemHostUnregister(ptr), "cuMemHostUnregister")


def register_host(cuda, ary: np.ndarray):
    """ary page-locked in place by the driver: (the array to copy from, the call that unlocks it)."""
    if getattr(cuda, "__name__", None) == "pycuda.driver":
        return ary, _Libcuda().register(ary)
    reg = cuda.register_host_memory(ary)
    return reg, reg.base.unregister


@contextmanager
def _opened(model):
    """A descriptor of the model's file for preadv, None for a model without one."""
    path = getattr(model, "path", None)
    if getattr(model, "file", None) is None or path is None:
        yield None
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def _expert_sources(model, plan: StreamPlan) -> dict[tuple[int, str], np.ndarray]:
    P = plan.pinned_experts
    return {(i, t): model.tensor(f"blk.{i}.{t}.weight").raw[P:]
            for i in range(model.config.n_layers) for t in EXPERT_TENSORS}


def _ffn_sources(model, plan: StreamPlan) -> dict[tuple[int, str], np.ndarray]:
    return {(i, t): model.tensor(f"blk.{i}.{t}.weight").raw
            for i in range(plan.ffn_layers, model.config.n_layers) for t in DENSE_FFN_TENSORS}


SOURCES = {"moe": _expert_sources, "dense": _ffn_sources}     # by ModelConfig.ffn_kind


class HostExperts:
    """Experts [pinned, E) of every layer (a dense model: the FFNs of layers [ffn_layers, n_layers))
    in host memory for async copies: src[(layer, tensor)].

    `method` names the ways used ("register", "copy", "pageable", joined by "+" when a limit was
    reached part way; "in place" for a model already in page-locked memory), `seconds` and
    `nbytes` the cost of staging them; `pinned` is False once any of them stayed pageable."""

    def __init__(self, cuda, model, plan: StreamPlan, staging: str = "auto"):
        if staging not in STAGINGS:
            raise ValueError(f"staging {staging!r}: choose one of {', '.join(STAGINGS)}")
        self.cuda, self.staging = cuda, staging
        self.src: dict[tuple[int, str], np.ndarray] = {}
        self.owned: list[tuple[str, object]] = []        # (way, page-locked array or unlock call) for release()
        self.bytes_by = {"register": 0, "copy": 0, "pageable": 0}
        raws = SOURCES[model.config.ffn_kind](model, plan)
        self.nbytes = sum(r.nbytes for r in raws.values())
        t0 = time.perf_counter()
        if getattr(model, "host_pinned", False):
            self.src, self.method = raws, "in place"
        else:
            self._ladder = list(LADDERS[staging])
            try:
                with _opened(model) as fd:
                    for key, raw in raws.items():
                        self.src[key] = self._stage(model, raw, fd) if raw.size else raw
            except BaseException:
                self.release()
                raise
            self.method = "+".join(k for k, n in self.bytes_by.items() if n) or "none"
        self.seconds = time.perf_counter() - t0
        self.pinned = self.bytes_by["pageable"] == 0
        if self.nbytes and self.method != "in place":
            log.info("streamed weights staged by %s (staging=%s): %.2f GiB in %.2f s = %.2f GB/s",
                     self.method, staging, self.nbytes / 2**30, self.seconds, self.rate / 1e9)

    @property
    def rate(self) -> float:
        """Bytes staged per second."""
        return self.nbytes / max(self.seconds, 1e-9)

    def _stage(self, model, raw: np.ndarray, fd: int | None) -> np.ndarray:
        while True:
            how = self._ladder[0]
            try:
                if how == "register":
                    reg, unlock = register_host(self.cuda, anonymous(raw.nbytes))
                elif how == "copy":
                    buf = self.cuda.pagelocked_empty(raw.shape, np.uint8)
            except Exception as exc:                      # locked-memory limit, out of memory, old driver
                if len(self._ladder) == 1:
                    raise RuntimeError(f"staging={self.staging}: the driver refused: {exc}") from exc
                log.warning(REFUSED[how], exc)
                self._ladder.pop(0)
                continue
            self.bytes_by[how] += raw.nbytes
            if how == "pageable":
                return raw
            if how == "copy":
                np.copyto(buf, raw)
                self.owned.append((how, buf))
                return buf
            self.owned.append((how, unlock))
            offset = file_offset(model, raw)
            dst = reg[:raw.nbytes]
            if fd is None or offset is None:
                np.copyto(dst, raw.reshape(-1))
            else:
                read_into(fd, memoryview(dst), offset)
            return dst.reshape(raw.shape)

    def release(self) -> None:
        """Unregister and free what was staged (the context must be current)."""
        for how, held in self.owned:
            if how == "register":
                held()
            elif hasattr(held.base, "free"):
                held.base.free()
        self.owned.clear()
        self.src.clear()
