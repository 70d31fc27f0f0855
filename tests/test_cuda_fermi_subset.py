"""The CUDA kernels stay in the Fermi subset, and their block decoders match gguf's.

Needs nvcc (the toolkit, no GPU): every native/cuda/*.cu is compiled to PTX and cubin and
scanned by tools/check_fermi_subset.py; the decoders in quant.cuh are built for the host and
compared with gguf's numpy dequantizer on random blocks.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import check_fermi_subset as fermi  # noqa: E402

from native.cuda.kernels import GEMM_KERNELS  # noqa: E402

from .gpu.tiny_gguf import BLOCK_SCALES, set_scales  # noqa: E402
from .gpu.tiny_gguf import random_blocks as scaled_blocks  # noqa: E402

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not on PATH")

DECODE_ATOL = 0.0      # integer unpacking and one fp32 multiply-add: bit-identical to numpy up to fma
DECODE_RTOL = 1e-6     # d*q - m may fuse into one fma on the host compiler


def test_every_kernel_in_subset():
    run = subprocess.run([sys.executable, str(REPO / "tools/check_fermi_subset.py")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 violations" in run.stdout
    for kernel in ("gemm_q4_k", "gemm_gate_up_iq2_xxs", "gemm_mxfp4", "rows_iq1_m", "gdn_chunk_scan", "attn_prefill",
                   "moe_route", "conv1d_silu"):
        assert kernel in run.stdout


FORBIDDEN_SOURCE = r"""
#include <cuda_fp16.h>
extern "C" __global__ void bad(const float* x, float* y, const __half* h, const int* a) {
    float v = __ldg(x + threadIdx.x);
    v += __shfl_down_sync(0xffffffffu, v, 1);
    __half p = __hmul(h[0], h[1]);
    y[threadIdx.x] = v + __half2float(p) + (float)__dp4a(a[0], a[1], 0);
}
"""


def test_check_catches_forbidden_code(tmp_path):
    cu = tmp_path / "bad.cu"
    cu.write_text(FORBIDDEN_SOURCE)
    violations, _ = fermi.check_file(cu, NVCC, "sm_75", tmp_path)
    found = " ".join(v.what for v in violations)
    for why in ("warp shuffle", "read-only cache load", "half-precision", "integer dot-product"):
        assert why in found, found


def test_check_catches_register_and_shared_limits():
    log = ("ptxas info    : Function properties for big\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 80 registers, used 1 barriers, 50000 bytes smem, 400 bytes cmem[0]\n")
    violations, usage = fermi.scan_ptxas("x.cu", log)
    assert usage == {"big": (80, 50000, 0)}
    assert len(violations) == 2


@pytest.fixture(scope="module")
def dequant_host(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("dq") / "dequant_host"
    src = REPO / "native/cuda/dequant_host.cpp"
    subprocess.run([NVCC, "-x", "cu", "-I", str(src.parent), str(src), "-o", str(exe)], check=True)
    return exe


def random_blocks(qtype: Q, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes with every scale set to a finite value, so nothing decodes to inf/nan."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8).reshape(n, 4)
    if qtype == Q.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == Q.BF16:
        top_halves = rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16
        return top_halves.astype(np.uint16).view(np.uint8).reshape(n, 2)
    return scaled_blocks(qtype, n // block, rng)


def edge_blocks(qtype: Q, n: int) -> np.ndarray:
    """Blocks of extremes, a quarter each: all bytes zero (zero scales, MXFP4's smallest exponent);
    all bytes 0xff with the largest finite f16 scales; every byte value in turn (every 1-, 2- and
    4-bit code at every place) under unit scales; the ramp again under the smallest subnormal."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = n // block
    raw = (np.arange(nb * size) % 251).astype(np.uint8).reshape(nb, size)       # 251: prime, shifts per block
    q = nb // 4
    raw[:q] = 0
    raw[q:2 * q] = 255
    f16 = np.full((nb, 2), 1.0, np.float16)
    f16[q:2 * q] = np.float16(65504.0)
    f16[3 * q:] = np.uint16(1).view(np.float16)
    f16[:q] = 0.0
    if qtype in BLOCK_SCALES:                                   # MXFP4: the bytes' own exponents
        set_scales(raw, qtype, f16[:, 0], f16[:, 1])
    return raw


def decode_on_host(exe: Path, qtype: Q, raw: np.ndarray) -> np.ndarray:
    n = raw.size // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
    run = subprocess.run([str(exe), qtype.name, str(n)], input=raw.tobytes(), capture_output=True, check=True)
    return np.frombuffer(run.stdout, np.float32)


@pytest.mark.parametrize("qtype", list(GEMM_KERNELS), ids=lambda q: q.name)
def test_block_decoders_match_gguf(dequant_host, qtype):
    n = 4096
    raw = random_blocks(qtype, n, np.random.default_rng(int(qtype)))
    if qtype == Q.F32:
        want = raw.view(np.float32).reshape(-1)
    else:
        want = dequantize(raw.reshape(1, -1), qtype).reshape(-1).astype(np.float32)
    np.testing.assert_allclose(decode_on_host(dequant_host, qtype, raw), want, rtol=DECODE_RTOL, atol=DECODE_ATOL)


@pytest.mark.parametrize("qtype", [q for q in GEMM_KERNELS if q not in (Q.F32, Q.F16, Q.BF16)],
                         ids=lambda q: q.name)
def test_block_decoders_match_gguf_on_edges(dequant_host, qtype):
    raw = edge_blocks(qtype, 256 * 16)
    want = dequantize(raw.reshape(1, -1), qtype).reshape(-1).astype(np.float32)
    got = decode_on_host(dequant_host, qtype, raw)
    np.testing.assert_allclose(got, want, rtol=DECODE_RTOL, atol=DECODE_ATOL)
    assert not np.isnan(want).any()
    assert np.isfinite(want).all() or qtype == Q.MXFP4        # 12 * 2^127 overflows in gguf too
