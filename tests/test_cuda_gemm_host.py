"""The GEMM kernels of native/cuda/gemm.cu against numpy, on the CPU.

native/cuda/gemm_host.cpp compiles gemm.cu for the host and runs every block as 256 threads at
a std::barrier, so the tile mapping, the loader roles and the two-stage pipeline of every
kernel (each weight type, plain and fused gate/up) are checked without a GPU. tests/gpu repeats
the checks on a device, at the model's widths.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from common.reference.ops import silu
from native.cuda.kernels import GATE_UP_KERNELS, GEMM_BM, GEMM_KERNELS

from .cuda_host_build import host_program, needs_gxx
from .gpu.test_cuda_kernels import as_raw, dq
from .gpu.tiny_gguf import weight

pytestmark = needs_gxx
GEMM_RTOL = 2e-6       # fp32 sums of K=256 products in another order, relative to |X||W|
GATE_UP_RTOL = 1.1 * GEMM_RTOL  # through silu(g) * u: silu's slope is at most 1.1, relative to |X||W|(|g| + |u|)


@pytest.fixture(scope="module")
def gemm_host(tmp_path_factory) -> Path:
    return host_program(tmp_path_factory.mktemp("gemm"), "gemm_host", "-O1")


def launch(exe: Path, tmp: Path, kernel: str, X, raw, tiles, xrows, woff, Y, *, ldx, ldy, row_bytes, N, K,
           accumulate) -> np.ndarray:
    files = {}
    for name, a in (("x", X), ("w", raw), ("tiles", tiles), ("xrows", xrows), ("woff", woff), ("y", Y)):
        if a is None:
            files[name] = "-"
            continue
        files[name] = str(tmp / name)
        np.ascontiguousarray(a).tofile(files[name])
    subprocess.run([str(exe), kernel, files["x"], files["w"], files["tiles"], files["xrows"], files["woff"],
                    files["y"], str(ldx), str(ldy), str(row_bytes), str(N), str(K), str(len(tiles)),
                    str(int(accumulate))], check=True)
    return np.fromfile(files["y"], np.float32).reshape(Y.shape)


@pytest.mark.parametrize("qtype", list(GEMM_KERNELS), ids=lambda q: q.name)
def test_gemm_on_host(gemm_host, tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    kernel, bm = GEMM_KERNELS[qtype], GEMM_BM

    # dense, accumulating, a partial column block, a full row tile and one with a single busy warp
    T, N, K = 72, 150, 256
    raw, qt = as_raw(*weight(qtype, (N, K), 0.05, rng))
    W = dq(raw, qt).reshape(N, K)
    X = rng.standard_normal((T, K)).astype(np.float32)
    Y0 = rng.standard_normal((T, N)).astype(np.float32)
    tiles = np.array([[0, r, min(bm, T - r), 0] for r in range(0, T, bm)], np.int32)
    got = launch(gemm_host, tmp_path, kernel, X, raw, tiles, None, None, Y0, ldx=K, ldy=N,
                 row_bytes=raw.shape[1], N=N, K=K, accumulate=True)
    scale = np.abs(X).sum(1)[:, None] * np.abs(W).max()
    assert np.max(np.abs(got - (Y0 + X @ W.T)) / scale) < GEMM_RTOL

    # grouped experts over gathered rows, into NaN: every routed row written, the row past them not
    E, F = 3, 40
    raw, qt = as_raw(*weight(qtype, (E * F, K), 0.05, rng))
    W = dq(raw, qt).reshape(E, F, K)
    rows = rng.integers(0, T, 45).astype(np.int32)
    groups = [(2, 0, 30), (0, 30, 15)]                  # (expert, row0, nrows)
    eb = raw.nbytes // E
    got = launch(gemm_host, tmp_path, kernel, X, raw, np.array([[e, r, n, 0] for e, r, n in groups], np.int32),
                 rows, np.arange(E, dtype=np.int64) * eb, np.full((len(rows) + 1, F), np.nan, np.float32),
                 ldx=K, ldy=F, row_bytes=eb // F, N=F, K=K, accumulate=False)
    assert np.isnan(got[-1]).all()
    for e, r0, n in groups:
        want = X[rows[r0:r0 + n]] @ W[e].T
        scale = np.abs(X[rows[r0:r0 + n]]).sum(1)[:, None] * np.abs(W[e]).max()
        assert np.max(np.abs(got[r0:r0 + n] - want) / scale) < GEMM_RTOL, (e, r0)


@pytest.mark.parametrize("qtype", list(GATE_UP_KERNELS), ids=lambda q: q.name)
def test_gemm_gate_up_on_host(gemm_host, tmp_path, qtype):
    """Fused gate/up of experts over gathered rows into NaN: the up table is not the gate table
    shifted (experts in reverse order), F spans a full and a partial block of features."""
    rng = np.random.default_rng(100 + int(qtype))
    T, E, F, K = 50, 3, 100, 256
    raw, qt = as_raw(*weight(qtype, (2 * E * F, K), 0.05, rng))
    W = dq(raw, qt).reshape(2, E, F, K)                   # gate experts, then up experts in reverse
    X = rng.standard_normal((T, K)).astype(np.float32)
    rows = rng.integers(0, T, 91).astype(np.int32)
    groups = [(1, 0, 64), (2, 64, 20), (0, 84, 7)]       # (expert, row0, nrows): full, partial, one busy warp
    eb = raw.nbytes // (2 * E)
    woff = np.concatenate([np.arange(E), 2 * E - 1 - np.arange(E)]).astype(np.int64) * eb
    tiles = np.array([[e, r, n, 0] for e, r, n in groups], np.int32)
    got = launch(gemm_host, tmp_path, GATE_UP_KERNELS[qtype], X, raw, tiles, rows, woff,
                 np.full((len(rows) + 1, F), np.nan, np.float32), ldx=K, ldy=F, row_bytes=eb // F, N=F, K=K,
                 accumulate=False)
    assert np.isnan(got[-1]).all()
    for e, r0, n in groups:
        Xe = X[rows[r0:r0 + n]]
        g, u = Xe @ W[0, e].T, Xe @ W[1, E - 1 - e].T
        scale = np.abs(Xe).sum(1)[:, None] * np.abs(W).max() * (np.abs(g) + np.abs(u))
        assert np.max(np.abs(got[r0:r0 + n] - silu(g) * u) / scale) < GATE_UP_RTOL, (e, r0)
