"""A numpy stand-in for pycuda's driver and for the backend's `Kernels`, for tests without a GPU.

Device memory is one numpy byte array addressed by integer pointers; every kernel is the
numpy statement of what its CUDA twin computes, with the same arguments. Work runs at issue
time, so this checks the backend's host logic (plan, pointer tables, grouping, the slot ring,
state in and out), not the CUDA code, which tests/gpu checks on a GPU.
"""
from __future__ import annotations

import mmap
import time

import numpy as np

from .cuda_emulator_kernels import FakeKernels

BASE = 1 << 16


class Memory:
    def __init__(self, nbytes: int):
        self.buf = np.zeros(nbytes, np.uint8)
        self.top = BASE

    def view(self, ptr: int, shape, dtype=np.float32, strides=None) -> np.ndarray:
        return np.ndarray(shape, dtype=dtype, buffer=self.buf, offset=int(ptr) - BASE, strides=strides)


class _Alloc:
    def __init__(self, ptr):
        self.ptr = ptr

    def __int__(self):
        return self.ptr

    def free(self):
        pass


class _Stream:
    def synchronize(self):
        pass

    def wait_for_event(self, ev):
        pass


class _Event:
    """Work runs at issue time, so an event's time is the host clock when it is recorded."""
    at = 0.0

    def record(self, stream=None):
        self.at = time.perf_counter()

    def time_since(self, other):
        return (self.at - other.at) * 1e3

    def synchronize(self):
        pass

    def query(self):
        return True


class _Context:
    def push(self):
        pass

    def pop(self):
        pass

    def detach(self):
        pass


class RegisteredHostMemory:
    """pycuda's: the registered array's base, holding the array it was made from as its own base."""

    def __init__(self, ary: np.ndarray):
        self.base, self.registered = ary, True
        self.__array_interface__ = ary.__array_interface__

    def unregister(self):
        self.registered = False


def _span(arr: np.ndarray) -> tuple[int, int]:
    start = arr.__array_interface__["data"][0]
    return start, start + arr.nbytes


class FakeDriver:
    """The subset of pycuda.driver the backend uses."""

    def __init__(self, nbytes: int = 512 << 20):
        self.mem = Memory(nbytes)
        self.locked: list = []          # (array, its registration or None): the page-locked host memory
        self.Stream, self.Event = _Stream, _Event
        driver = self

        class Device:
            def __init__(self, i):
                pass

            @staticmethod
            def count():
                return 1

            def name(self):
                return "numpy emulator"

            def make_context(self):
                return _Context()
        self.Device = Device
        self.driver = driver

    def init(self):
        pass

    def mem_alloc(self, n: int):
        ptr = self.mem.top
        self.mem.top += -(-n // 256) * 256
        if self.mem.top - BASE > self.mem.buf.size:
            raise MemoryError("emulated device out of memory")
        return _Alloc(ptr)

    def mem_get_info(self):
        return self.mem.buf.size - (self.mem.top - BASE), self.mem.buf.size

    def pagelocked_empty(self, shape, dtype):
        arr = np.empty(shape, dtype)
        self.locked.append((arr, None))
        return arr

    def register_host_memory(self, ary, flags=0):
        """cuMemHostRegister's checks: a contiguous numpy array of whole, page-aligned pages."""
        if not isinstance(ary, np.ndarray) or not ary.flags.c_contiguous:
            raise ValueError("register_host_memory: ary argument is not a contiguous numpy array")
        start, end = _span(ary)
        if start % mmap.PAGESIZE or (end - start) % mmap.PAGESIZE:
            raise ValueError("cuMemHostRegister failed: invalid argument (not whole pages)")
        reg = RegisteredHostMemory(ary)
        out = np.asarray(reg)
        self.locked.append((out, reg))
        return out

    def is_locked(self, arr: np.ndarray) -> bool:
        """Whether arr lies in page-locked memory: pagelocked_empty's, or still registered."""
        start, end = _span(arr)
        return any(a <= start and end <= b and (reg is None or reg.registered)
                   for a, b, reg in ((*_span(x), r) for x, r in self.locked))

    def memcpy_htod(self, ptr, src):
        src = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
        self.mem.view(ptr, src.size, np.uint8)[:] = src

    def memcpy_htod_async(self, ptr, src, stream=None):
        self.memcpy_htod(ptr, src)

    def memcpy_dtoh(self, dst, ptr):
        flat = dst.reshape(-1).view(np.uint8)
        flat[:] = self.mem.view(ptr, flat.size, np.uint8)

    def memcpy_dtoh_async(self, dst, ptr, stream=None):
        self.memcpy_dtoh(dst, ptr)

    def memset_d32_async(self, ptr, value, count, stream=None):
        self.mem.view(ptr, count, np.uint32)[:] = value


def emulate_cuda(monkeypatch, driver: "FakeDriver | None" = None) -> "FakeDriver":
    """The cuda prefill backend on this emulator: its driver and its kernels; returns the driver."""
    from native.cuda import kernels as cuda_kernels
    from services.prefill.backends import cuda as cuda_backend
    driver = driver or FakeDriver()
    monkeypatch.setattr(cuda_backend, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_kernels, "Kernels", lambda: FakeKernels(driver))
    return driver
