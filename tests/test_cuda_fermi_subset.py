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

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not on PATH")

DECODE_ATOL = 0.0      # integer unpacking and one fp32 multiply-add: bit-identical to numpy up to fma
DECODE_RTOL = 1e-6     # d*q - m may fuse into one fma on the host compiler


def test_every_kernel_in_subset():
    run = subprocess.run([sys.executable, str(REPO / "tools/check_fermi_subset.py")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 violations" in run.stdout
    for kernel in ("gemm_q4_k", "gdn_chunk_scan", "attn_prefill", "moe_route", "conv1d_silu"):
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
    """Random bytes with every f16 scale set to a finite value, so nothing decodes to inf/nan."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n // block, size), dtype=np.uint8)

    def scale(k):
        return rng.uniform(0.001, 0.1, size=(n // block, k)).astype(np.float16).view(np.uint8)

    if qtype == Q.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8).reshape(n, 4)
    if qtype == Q.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == Q.BF16:
        top_halves = rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16
        return top_halves.astype(np.uint16).view(np.uint8).reshape(n, 2)
    if qtype in (Q.Q8_0, Q.Q4_0):
        raw[:, :2] = scale(1)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        raw[:, :4] = scale(2)
    elif qtype == Q.Q6_K:
        raw[:, 208:210] = scale(1)
    return raw


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K],
                         ids=lambda q: q.name)
def test_block_decoders_match_gguf(dequant_host, qtype):
    n = 4096
    raw = random_blocks(qtype, n, np.random.default_rng(int(qtype)))
    if qtype == Q.F32:
        want = raw.view(np.float32).reshape(-1)
    else:
        want = dequantize(raw.reshape(1, -1), qtype).reshape(-1).astype(np.float32)
    run = subprocess.run([str(dequant_host), qtype.name, str(n)], input=raw.tobytes(),
                         capture_output=True, check=True)
    got = np.frombuffer(run.stdout, np.float32)
    np.testing.assert_allclose(got, want, rtol=DECODE_RTOL, atol=DECODE_ATOL)
