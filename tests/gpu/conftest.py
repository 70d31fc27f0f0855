"""GPU tests: skip cleanly unless pycuda, a CUDA device and nvcc are all present."""
from __future__ import annotations

import numpy as np
import pytest

from services.prefill.backends.cuda import CUDABackend


def pytest_collection_modifyitems(config, items):
    ok, why = CUDABackend.availability()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"cuda backend unavailable: {why}")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


class Device:
    """A CUDA context with helpers to put numpy arrays on the device and read them back."""

    def __init__(self):
        import pycuda.driver as cuda
        cuda.init()
        self.cuda = cuda
        self.ctx = cuda.Device(0).make_context()
        self.allocs = []
        from native.cuda.kernels import Kernels
        self.k = Kernels()
        self.s = cuda.Stream()

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        mem = self.cuda.mem_alloc(max(a.nbytes, 4))
        self.cuda.memcpy_htod(mem, a)
        self.allocs.append(mem)
        return int(mem)

    def zeros(self, shape, dtype=np.float32) -> int:
        return self.put(np.zeros(shape, dtype))

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        self.s.synchronize()
        out = np.empty(shape, dtype)
        self.cuda.memcpy_dtoh(out, ptr)
        return out

    def close(self):
        for m in self.allocs:
            m.free()
        self.ctx.pop()
        self.ctx.detach()


@pytest.fixture(scope="module")
def dev():
    d = Device()
    yield d
    d.close()
