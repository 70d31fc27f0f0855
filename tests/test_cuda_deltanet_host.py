"""The Gated DeltaNet kernels of native/cuda/deltanet.cu against the recurrent rule, on the CPU.

native/cuda/deltanet_host.cpp compiles deltanet.cu for the host and runs every block as 256
threads at a std::barrier, so the chunk prep (products, triangular inverse, solves) and the
scan's double-buffered tile walk are checked without a GPU: partial last chunks, a single token,
both head layouts, a nonzero start state. tests/gpu repeats the check on a device.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from common.reference.deltanet import recurrent_rule
from common.reference.ops import l2_norm, sigmoid

from .cuda_host_build import host_program, needs_gxx

pytestmark = needs_gxx
SCAN_RTOL = 1e-4       # fp32 chunked form against the float64 recurrence, relative to the largest value


@pytest.fixture(scope="module")
def deltanet_host(tmp_path_factory) -> Path:
    return host_program(tmp_path_factory.mktemp("deltanet"), "deltanet_host", "-O1", "-fno-strict-aliasing")


CASES = [(T, 2, 4, 32, 32, 1) for T in (1, 63, 64, 65, 200)] + [
    (65, 2, 2, 32, 32, 0), (130, 2, 4, 64, 32, 0), (70, 2, 2, 64, 32, 1), (200, 2, 4, 32, 64, 0),
    (1, 1, 2, 128, 128, 1), (70, 1, 2, 128, 128, 0), (40, 1, 1, 96, 32, 1),
    (150, 2, 4, 64, 64, 1), (5, 2, 4, 32, 64, 1)]               # the last two: tests/gpu's shapes


@pytest.mark.parametrize("T,nk,nv,dk,dv,tiled", CASES)
def test_gated_deltanet_on_host(deltanet_host, tmp_path, T, nk, nv, dk, dv, tiled):
    rng = np.random.default_rng(T * 1000 + dk + dv + tiled)
    C = 2 * nk * dk + nv * dv
    X = rng.standard_normal((T, C)).astype(np.float32)
    X[:, :nk * dk] = (l2_norm(X[:, :nk * dk].reshape(T, nk, dk)) / np.sqrt(dk)).reshape(T, -1)
    X[:, nk * dk:2 * nk * dk] = l2_norm(X[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)).reshape(T, -1)
    g = (-np.abs(rng.standard_normal((T, nv))) * 0.3).astype(np.float32)
    beta = sigmoid(rng.standard_normal((T, nv)).astype(np.float32))
    S0 = (rng.standard_normal((nv, dk, dv)) * 0.3).astype(np.float32)
    files = {name: tmp_path / name for name in ("qkv", "g", "beta", "state", "o")}
    o0 = np.full((T, nv * dv), np.nan, np.float32)            # every output element must be written
    for name, a in (("qkv", X), ("g", g), ("beta", beta), ("state", S0), ("o", o0)):
        np.ascontiguousarray(a).tofile(files[name])
    subprocess.run([str(deltanet_host), *(str(f) for f in files.values()),
                    *(str(x) for x in (T, C, nk, nv, dk, dv, tiled))], check=True)
    got_s = np.fromfile(files["state"], np.float32).reshape(nv, dk, dv)
    got_o = np.fromfile(files["o"], np.float32).reshape(T, nv, dv).transpose(1, 0, 2)

    heads = np.arange(nv) % nk if tiled else np.arange(nv) // (nv // nk)
    q = X[:, :nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2).astype(np.float64)
    k = X[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2).astype(np.float64)
    v = X[:, 2 * nk * dk:].reshape(T, nv, dv).transpose(1, 0, 2).astype(np.float64)
    want_o, want_s = recurrent_rule(q, k, v, g.T.astype(np.float64), beta.T.astype(np.float64), S0.astype(np.float64))
    assert np.max(np.abs(got_o - want_o)) <= SCAN_RTOL * np.max(np.abs(want_o))
    assert np.max(np.abs(got_s - want_s)) <= SCAN_RTOL * np.max(np.abs(want_s))
