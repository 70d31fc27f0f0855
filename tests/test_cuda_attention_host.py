"""The prefill attention kernel of native/cuda/attention.cu against a float64 numpy softmax, on the CPU.

native/cuda/attention_host.cpp compiles attention.cu for the host and runs every block as
ATT_THREADS threads at a std::barrier, so the row mapping (token, head of a group), the causal
limits of chunked prefill over a cached prefix, the stages and the online softmax are checked
without a GPU. Shapes stay small: the host runs a barrier as a few hundred thread switches.
tests/gpu/test_cuda_kernels.py repeats the check on a device, up to 65,536 keys.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from native.cuda.kernels import ATT_BQ, ATT_MAX_HD, ATT_THREADS, KernelError, Kernels

from .cuda_host_build import host_program, needs_gxx

ATTN_RTOL = 1e-5       # fp32 scores, exp and running sums vs float64, relative to the largest |V|

# (T, pos0, nh, nkv, hd): one token; GQA 8 at the model's head dim; an odd multiple of 16; a
# prefix that ends inside a key tile; rows of one block that see different key tiles; T past a tile
CASES = [(1, 0, 4, 1, 64), (5, 37, 16, 2, ATT_MAX_HD), (33, 300, 2, 2, 80), (64, 0, 4, 1, ATT_MAX_HD),
         (100, 37, 2, 2, 64), (257, 0, 2, 2, 64), (33, 0, 16, 2, 64), (5, 300, 2, 2, ATT_MAX_HD),
         (64, 37, 16, 2, 80), (1, 300, 16, 2, ATT_MAX_HD), (40, 30, 4, 2, 32), (17, 130, 4, 1, 16)]


@pytest.fixture(scope="module")
def attention_host(tmp_path_factory) -> Path:
    return host_program(tmp_path_factory.mktemp("attention"), "attention_host", "-O2")


def reference(q, kc, vc, gate, pos0: int) -> np.ndarray:
    """Causal GQA softmax attention in float64, gated: [T, nh, hd]."""
    T, nh, hd = q.shape
    grp = nh // kc.shape[1]
    k = np.repeat(kc, grp, axis=1).astype(np.float64)
    v = np.repeat(vc, grp, axis=1).astype(np.float64)
    sc = np.einsum("thd,shd->hts", q.astype(np.float64), k) / np.sqrt(hd)
    sc = np.where((pos0 + np.arange(T))[:, None] >= np.arange(kc.shape[0])[None], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v) / (1.0 + np.exp(-gate.astype(np.float64)))


@needs_gxx
@pytest.mark.parametrize("T,pos0,nh,nkv,hd", CASES)
def test_attention_on_host(attention_host, tmp_path, T, pos0, nh, nkv, hd):
    rng = np.random.default_rng(T * 1000 + pos0 + hd)
    S = pos0 + T
    q = (rng.standard_normal((T, nh, hd)) * 2.0).astype(np.float32)   # peaked rows: the running max moves
    kc, vc = rng.standard_normal((2, S, nkv, hd)).astype(np.float32)
    qg = rng.standard_normal((T, nh, 2 * hd)).astype(np.float32)      # the gate is the second half of a row
    files = {}
    for name, a in (("q", q), ("kc", kc), ("vc", vc), ("gate", qg)):
        files[name] = str(tmp_path / name)
        a.tofile(files[name])
    out = tmp_path / "out"
    subprocess.run([str(attention_host), files["q"], files["kc"], files["vc"], files["gate"], str(out),
                    str(T), str(pos0), str(nh), str(nkv), str(hd), str(nh * 2 * hd), str(2 * hd), str(hd)],
                   check=True)
    got = np.fromfile(out, np.float32).reshape(T, nh, hd)
    want = reference(q, kc, vc, qg[..., hd:], pos0)
    assert np.max(np.abs(got - want)) < ATTN_RTOL * np.abs(vc).max()


def test_launch_is_the_grid_the_host_runs():
    """Kernels.attention launches what attention_host.cpp runs: a block per ATT_BQ rows of a KV head."""
    calls = []
    stub = SimpleNamespace(_go=lambda *a: calls.append(a))
    args = dict(q=0x1000, kc=0x2000, vc=0x3000, gate=0x4004, ldg=8192, hsg=512, out=0x5000, T=100, pos0=37,
                nh=16, nkv=2, hd=256)
    Kernels.attention(stub, "stream", *args.values())
    assert calls[0][:3] == ("attn_prefill", (-(-100 * 8 // ATT_BQ), 2, 1), (ATT_THREADS, 1, 1))
    for bad in (dict(hd=ATT_MAX_HD + 16), dict(hd=72), dict(nkv=3), dict(q=0x1008), dict(kc=0x2004)):
        with pytest.raises(KernelError):
            Kernels.attention(stub, "stream", *{**args, **bad}.values())
