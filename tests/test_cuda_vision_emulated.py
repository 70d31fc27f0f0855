"""The GPU vision encoder's host logic (native/cuda/vision.py) on the CPU: the driver is
tests/cuda_emulator.py's, and each vision.cu kernel is replaced by the numpy statement of what it
computes, with the same arguments and the same device layouts. So the tower's upload, the buffers,
their offsets and strides and the order of the launches are checked against the reference encoder on
the tiny models; the CUDA code itself is checked on a GPU (tests/gpu/test_cuda_vision.py) and against
the Fermi subset (tests/test_cuda_fermi_subset.py scans every native/cuda/*.cu)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from common.reference.ops import softmax
from common.reference.vision import VisionEncoder, gelu_erf, gelu_tanh, layer_norm, rotate
from common.vision.preprocess import preprocess
from native.cuda.vision import ACT_GELU_ERF, ACT_GELU_TANH, CudaVisionEncoder, KernelError, readable

from .cuda_emulator import FakeDriver
from .vision_helpers import MMPROJ_TYPES, SIZES_FOR_INTEROP, tiny_towers

# numpy statements of the kernels in float32 against the reference: other summation orders only
ENCODER_REL_TOL = 2e-5


class VisionDriver(FakeDriver):
    def memcpy_dtod_async(self, dst, src, size, stream=None):
        self.mem.view(int(dst), size, np.uint8)[:] = self.mem.view(int(src), size, np.uint8)


class FakeVisionKernels:
    """Each method mirrors native.cuda.vision.VisionKernels, on the emulated memory."""

    def __init__(self, driver: VisionDriver):
        self.m = driver.mem
        self.launches: list[str] = []

    def f32(self, ptr, shape):
        return self.m.view(ptr, shape, np.float32)

    def gemm(self, stream, qtype, *, x, ldx, y, ldy, w, row_bytes, bias, n, rows, cols, accumulate=False, act=0):
        if not readable(Q(qtype), cols):
            raise KernelError(f"the vision GEMM cannot read {Q(qtype).name} rows of {cols}")
        raw = self.m.view(w, (rows, row_bytes), np.uint8)
        wd = raw.view(np.float32).reshape(rows, cols) if qtype == Q.F32 else \
            dequantize(np.ascontiguousarray(raw), Q(qtype)).astype(np.float32).reshape(rows, cols)
        X = self.m.view(x, (n, cols), np.float32, (ldx * 4, 4))
        Y = self.m.view(y, (n, rows), np.float32, (ldy * 4, 4))
        s = X @ wd.T + (self.f32(bias, rows) if bias else 0)
        s = gelu_tanh(s) if act == ACT_GELU_TANH else gelu_erf(s) if act == ACT_GELU_ERF else s
        Y[:] = Y + s if accumulate else s
        self.launches.append("gemm")

    def layer_norm(self, stream, x, y, w, b, n, dim, eps):
        self.f32(y, (n, dim))[:] = layer_norm(self.f32(x, (n, dim)).copy(), self.f32(w, dim), self.f32(b, dim), eps)
        self.launches.append("layer_norm")

    def rotary_split(self, stream, qkv, cos, sin, q, k, v, n, heads, hd):
        parts = self.f32(qkv, (n, 3, heads, hd))
        cs, sn = self.f32(cos, (n, hd)), self.f32(sin, (n, hd))
        self.f32(q, (heads, n, hd))[:] = rotate(parts[:, 0], cs, sn).transpose(1, 0, 2)
        self.f32(k, (heads, n, hd))[:] = rotate(parts[:, 1], cs, sn).transpose(1, 0, 2)
        self.f32(v, (heads, n, hd))[:] = parts[:, 2].transpose(1, 0, 2)
        self.launches.append("rotary_split")

    def attention(self, stream, q, k, v, o, n, heads, hd):
        Q_, K_, V_ = (self.f32(p, (heads, n, hd)) for p in (q, k, v))
        out = self.f32(o, (n, heads, hd))
        for h in range(heads):
            out[:, h] = softmax(Q_[h] @ K_[h].T / np.float32(np.sqrt(hd))) @ V_[h]
        self.launches.append("attention")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_towers(tmp_path_factory.mktemp("vl"))


@pytest.mark.parametrize("mmproj_type", MMPROJ_TYPES)
def test_encoder_host_logic_as_the_reference(tiny, mmproj_type):
    vl, files = tiny
    mmproj = files[mmproj_type]
    driver = VisionDriver(64 << 20)
    kernels = FakeVisionKernels(driver)
    ours = CudaVisionEncoder(mmproj, kernels, driver)
    # the tiny tower's FFN is 48 wide: its down matrix, F16 in a q8_0 file, is read in place
    assert {b["down_w"].qtype for b in ours.blocks} == {Q.F32 if mmproj_type == "f32" else Q.F16}
    if mmproj_type == "q8_0":
        assert ours.blocks[0]["qkv_w"].qtype == Q.Q8_0
    for height, width in SIZES_FOR_INTEROP:
        patches = preprocess(vl.image(height, width, seed=height), mmproj.config)
        kernels.launches.clear()
        want, got = VisionEncoder(mmproj).encode(patches), ours.encode(patches)
        assert got.shape == want.shape
        assert np.abs(got - want).max() / np.abs(want).max() <= ENCODER_REL_TOL
        per_block = ["layer_norm", "gemm", "rotary_split", "attention", "gemm", "layer_norm", "gemm", "gemm"]
        assert kernels.launches == ["gemm", *per_block * mmproj.config.n_blocks, "layer_norm", "gemm", "gemm"]
