"""The tiled causal prefill attention (native/cpu/attn_tiled_*.c) of every ISA this CPU runs
against a float64 numpy softmax attention: a chunk of queries at the end of T keys and a chunk
from position 0, with several query heads per KV head, in the engine's layouts."""
from __future__ import annotations

import numpy as np
import pytest

from native import cpu_lib
from native.cpu_lib import ffi, lib, ptr

ISAS = cpu_lib.supported_isas()
CHUNK = 256   # the runner's prefill chunk (NATIVE_CHUNK)
# fp32 dots of hd terms and fp32 sums of up to T weights against float64, and e^x within 2 ulp
# (fm_expf): the output, a convex combination of values of size ~1, moves by a few 1e-6.
ATTN_ATOL = 5e-5


def attn_tiled(isa: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """q: (nq, nkv, group, 2, hd) float32, queries then gates as the engine keeps them; k, v:
    (T, nkv, hd) -> o (nq, nkv * group, hd) through the ISA's kernel, one call per KV head."""
    nq, nkv, group, _, hd = q.shape
    q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
    o = np.full((nq, nkv * group, hd), np.nan, np.float32)
    work = np.empty(lib.fm_attn_tiled_work(group, hd), np.float32)
    fp = lambda a, offset=0: ffi.cast("float *", a.ctypes.data + 4 * offset)  # noqa: E731
    for h in range(nkv):
        rc = lib.fm_attn_tiled_isa(cpu_lib.ISAS.index(isa), fp(q, h * group * 2 * hd), nkv * group * 2 * hd, 2 * hd,
                                   fp(k, h * hd), fp(v, h * hd), nkv * hd, fp(o, h * group * hd), nkv * group * hd,
                                   hd, nq, pos0, group, hd, 1.0 / np.sqrt(hd), ptr(work, "float *"))
        assert rc == 0
    return o


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """Causal softmax attention in float64: query i (position pos0 + i) sees keys 0..pos0 + i."""
    nq, nkv, group, _, hd = q.shape
    qq = q[:, :, :, 0].astype(np.float64)                              # (nq, nkv, group, hd)
    kk, vv = k.astype(np.float64), v.astype(np.float64)
    T = pos0 + nq
    s = np.einsum("ihgd,thd->ihgt", qq, kk[:T]) / np.sqrt(hd)          # (nq, nkv, group, T)
    mask = np.arange(T)[None, :] > (pos0 + np.arange(nq))[:, None]     # (nq, T)
    s = np.where(mask[:, None, None, :], -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("ihgt,thd->ihgd", p, vv[:T]).reshape(nq, nkv * group, hd)


def inputs(rng, T: int, nq: int, nkv: int, group: int, hd: int, pos0: int):
    q = rng.standard_normal((nq, nkv, group, 2, hd)).astype(np.float32) * 2.0   # peaked weights
    k = rng.standard_normal((T, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((T, nkv, hd)).astype(np.float32)
    k[pos0 + nq:] = np.nan   # past the chunk's last query: no query may read them
    v[pos0 + nq:] = np.nan
    return q, k, v


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(29)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000, 4096])
@pytest.mark.parametrize("where", ["end", "start"])
def test_tiled_attention_matches_float64(isa, T, where, rng):
    nq = min(T, CHUNK)
    pos0 = T - nq if where == "end" else 0
    q, k, v = inputs(rng, T, nq, nkv=2, group=4, hd=128, pos0=pos0)
    got = attn_tiled(isa, q, k, v, pos0)
    np.testing.assert_allclose(got, reference(q, k, v, pos0), rtol=0, atol=ATTN_ATOL)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("group, hd", [(8, 256), (3, 64), (5, 48), (1, 32), (80, 32)])
def test_tiled_attention_of_other_shapes(isa, group, hd, rng):
    """The model's group of 8 at hd 256; row counts that fill no tile of 4 (3, 5, and 80 heads:
    more than one block's rows); hd 48, which is no whole number of AVX-512 tiles (the generic
    path); and chunks that straddle key blocks."""
    for T, nq in ((200, 77), (130, 130)):
        pos0 = T - nq
        q, k, v = inputs(rng, T, nq, nkv=2, group=group, hd=hd, pos0=pos0)
        got = attn_tiled(isa, q, k, v, pos0)
        np.testing.assert_allclose(got, reference(q, k, v, pos0), rtol=0, atol=ATTN_ATOL)

