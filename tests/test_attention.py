"""The tiled causal attention (native/cpu/attn_tiled_*.c) of every ISA this CPU runs, over a KV
cache of every type, against a float64 numpy softmax attention over the same cache decoded
(common.kv_cache.kv_decode): a chunk of queries at the end of T keys and a chunk from position
0, several query heads per KV head, in the engine's layouts; the split decode over the pool
(attn_decode.c) for one sequence and for a batch; and the cache conversions (kv_cache_generic.c)."""
from __future__ import annotations

import numpy as np
import pytest

from common.kv_cache import KV_CODE, KV_TYPES, kv_decode, kv_encode
from native import cpu_lib
from native.cpu_lib import ffi, lib, ptr

ISAS = cpu_lib.supported_isas()
CHUNK = 256   # the runner's prefill chunk (NATIVE_CHUNK)
# fp32 dots of hd terms and fp32 sums of up to T weights against float64, and e^x within 2 ulp
# (fm_expf): the output, a convex combination of values of size ~1, moves by a few 1e-6.
ATTN_ATOL = 5e-5
F16_NAN = 0x7E00   # a q8_0 block scale that makes the whole block NaN


def fp(a: np.ndarray, offset_bytes: int = 0):
    return ffi.cast("float *", a.ctypes.data + offset_bytes)


def vp(a: np.ndarray, offset_bytes: int = 0):
    return ffi.cast("void *", a.ctypes.data + offset_bytes)


def head_bytes(kv_type: str, hd: int) -> int:
    return lib.fm_kv_head_bytes(KV_CODE[kv_type], hd)


def attn_tiled(isa: str, kv_type: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """q: (nq, nkv, group, 2, hd) float32, queries then gates as the engine keeps them; k, v: the
    cache (T, nkv, kv_width) in kv_type -> o (nq, nkv * group, hd) through the ISA's kernel, one
    call per KV head."""
    nq, nkv, group, _, hd = q.shape
    q = np.ascontiguousarray(q, np.float32)
    hb = head_bytes(kv_type, hd)
    o = np.full((nq, nkv * group, hd), np.nan, np.float32)
    work = np.empty(lib.fm_attn_tiled_work(group, hd), np.float32)
    for h in range(nkv):
        rc = lib.fm_attn_tiled_isa(cpu_lib.ISAS.index(isa), fp(q, 4 * h * group * 2 * hd), nkv * group * 2 * hd,
                                   2 * hd, vp(k, h * hb), vp(v, h * hb), nkv * hb, KV_CODE[kv_type],
                                   fp(o, 4 * h * group * hd), nkv * group * hd, hd, nq, pos0, 0, pos0 + nq, group, hd,
                                   1.0 / np.sqrt(hd), ptr(work, "float *"), ffi.NULL)
        assert rc == 0
    return o


def attn_decode(isa: str, kv_type: str, q: np.ndarray, ks: list, vs: list, splits: int = 0,
                threads: int = 2) -> np.ndarray:
    """q: (n, nkv, group, 2, hd), sequence b's one query at position len(ks[b]) - 1 -> o (n, nkv *
    group, hd) through fm_attn_decode on a pool."""
    n, nkv, group, _, hd = q.shape
    q = np.ascontiguousarray(q, np.float32)
    pool = cpu_lib.Pool(threads)
    pos = ffi.new("int[]", [len(k) - 1 for k in ks])
    work = np.empty(lib.fm_attn_decode_work(threads, n, pos, nkv, group, hd, splits), np.float32)
    o = np.full((n, nkv * group, hd), np.nan, np.float32)
    kp, vp_ = (ffi.new("void *[]", [vp(a) for a in arrays]) for arrays in (ks, vs))
    rc = lib.fm_attn_decode(pool.ptr, cpu_lib.ISAS.index(isa), n, pos, fp(q), nkv * group * 2 * hd, 2 * hd, kp, vp_,
                            nkv * head_bytes(kv_type, hd), KV_CODE[kv_type], fp(o), nkv * group * hd, hd, nkv, group,
                            hd, 1.0 / np.sqrt(hd), splits, ptr(work, "float *"))
    assert rc == 0
    return o


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """Causal softmax attention in float64 over decoded keys: query i (position pos0 + i) sees
    keys 0..pos0 + i."""
    nq, nkv, group, _, hd = q.shape
    qq = q[:, :, :, 0].astype(np.float64)                              # (nq, nkv, group, hd)
    kk, vv = k.astype(np.float64), v.astype(np.float64)
    T = pos0 + nq
    s = np.einsum("ihgd,thd->ihgt", qq, kk[:T], optimize=True) / np.sqrt(hd)   # (nq, nkv, group, T)
    mask = np.arange(T)[None, :] > (pos0 + np.arange(nq))[:, None]     # (nq, T)
    s = np.where(mask[:, None, None, :], -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("ihgt,thd->ihgd", p, vv[:T], optimize=True).reshape(nq, nkv * group, hd)


def poisoned(x: np.ndarray, kv_type: str, valid: int) -> np.ndarray:
    """x (T, nkv, hd) in the cache's type, with every position from `valid` on decoding to NaN:
    no query may read them."""
    a = kv_encode(x, kv_type).copy()
    if kv_type == "q8_0":
        a[valid:].reshape(-1, 34)[:, :2] = np.array([F16_NAN], np.uint16).view(np.uint8)
    else:
        a[valid:] = np.nan
    return a


def inputs(rng, T: int, nq: int, nkv: int, group: int, hd: int, pos0: int, kv_type: str):
    q = rng.standard_normal((nq, nkv, group, 2, hd)).astype(np.float32) * 2.0   # peaked weights
    k = poisoned(rng.standard_normal((T, nkv, hd)).astype(np.float32), kv_type, pos0 + nq)
    v = poisoned(rng.standard_normal((T, nkv, hd)).astype(np.float32), kv_type, pos0 + nq)
    return q, k, v


def check(got, q, k, v, pos0, kv_type):
    want = reference(q, kv_decode(k, kv_type), kv_decode(v, kv_type), pos0)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATTN_ATOL)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(29)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000, 4096])
@pytest.mark.parametrize("where", ["end", "start"])
def test_tiled_attention_matches_float64(isa, kv_type, T, where, rng):
    nq = min(T, CHUNK)
    pos0 = T - nq if where == "end" else 0
    q, k, v = inputs(rng, T, nq, nkv=2, group=4, hd=128, pos0=pos0, kv_type=kv_type)
    check(attn_tiled(isa, kv_type, q, k, v, pos0), q, k, v, pos0, kv_type)


OTHER_SHAPES = [(8, 256), (3, 64), (5, 48), (1, 32), (80, 32)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type, group, hd", [(t, g, hd) for t in KV_TYPES for g, hd in OTHER_SHAPES
                                                 if t != "q8_0" or hd % 32 == 0])   # q8_0: whole blocks of 32
def test_tiled_attention_of_other_shapes(isa, kv_type, group, hd, rng):
    """The model's group of 8 at hd 256; row counts that fill no tile of 4 (3, 5, and 80 heads:
    more than one block's rows); hd 48, which is no whole number of AVX-512 tiles (the generic
    path) nor of q8_0 blocks; and chunks that straddle key blocks."""
    for T, nq in ((200, 77), (130, 130)):
        pos0 = T - nq
        q, k, v = inputs(rng, T, nq, nkv=2, group=group, hd=hd, pos0=pos0, kv_type=kv_type)
        check(attn_tiled(isa, kv_type, q, k, v, pos0), q, k, v, pos0, kv_type)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("T, splits", [(1, 0), (300, 0), (4096, 0), (4096, 3), (4161, 16), (5000, 200)])
def test_split_decode_matches_float64(isa, kv_type, T, splits, rng):
    """One query token at position T - 1, group 8 at hd 256: the splits that 8 pool threads
    choose (0: 4 per KV head, once T holds them), a count that leaves a short last split, and
    more splits than key blocks."""
    q, k, v = inputs(rng, T, 1, nkv=2, group=8, hd=256, pos0=T - 1, kv_type=kv_type)
    check(attn_decode(isa, kv_type, q, [k], [v], splits, threads=8), q, k, v, T - 1, kv_type)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("splits, threads", [(0, 2), (0, 16), (5, 2)])
def test_split_decode_of_a_batch(isa, kv_type, splits, threads, rng):
    """Sequences of different lengths in one call: some split and some whole (16 threads split
    the long ones by themselves, 2 threads none)."""
    lengths = [1, 65, 700, 4100, 257]
    q = rng.standard_normal((len(lengths), 2, 8, 2, 256)).astype(np.float32) * 2.0
    ks, vs = [], []
    for T in lengths:
        _, k, v = inputs(rng, T, 1, nkv=2, group=8, hd=256, pos0=T - 1, kv_type=kv_type)
        ks.append(k)
        vs.append(v)
    got = attn_decode(isa, kv_type, q, ks, vs, splits, threads)
    for b, T in enumerate(lengths):
        check(got[b:b + 1], q[b:b + 1], ks[b], vs[b], T - 1, kv_type)


@pytest.mark.parametrize("isa", ISAS)
def test_kernels_convert_every_f16_value(isa):
    """With one key, the output is that key's value exactly: every f16 bit pattern (subnormals,
    infinities, NaNs) through each ISA's block conversion, against numpy's (as values: the sum
    0 + 1 * v makes -0 a +0)."""
    v = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(1, 256, 256)
    k = np.ones_like(v)
    q = np.ones((1, 256, 1, 2, 256), np.float32)
    got = attn_tiled(isa, "f16", q, k, v, 0)
    np.testing.assert_array_equal(got.reshape(-1), v.astype(np.float32).reshape(-1))


@pytest.mark.parametrize("isa", ISAS)
def test_kernels_convert_q8_0_blocks(isa, rng):
    x = rng.standard_normal((1, 64, 256)).astype(np.float32) * np.logspace(-6, 4, 64, dtype=np.float32)[None, :, None]
    v = kv_encode(x, "q8_0")
    got = attn_tiled(isa, "q8_0", np.ones((1, 64, 1, 2, 256), np.float32), kv_encode(np.ones_like(x), "q8_0"), v, 0)
    np.testing.assert_array_equal(got.reshape(x.shape), kv_decode(v, "q8_0"))


def store_cases(rng) -> np.ndarray:
    """(rows, 64) float32: random rows of many magnitudes, a zero block, q8_0 rounding ties
    (d = 1 exactly: k + 0.5), f16 ties, subnormals, overflow, infinities and NaNs."""
    rows = [rng.standard_normal(64) * scale for scale in (1e-30, 1e-7, 1e-3, 1.0, 3e2, 6e4, 1e30)]
    rows.append(np.concatenate([np.zeros(32), rng.standard_normal(32)]))
    ties = np.arange(-15.5, 16.5, 1.0)
    rows.append(np.concatenate([[127.0], ties[1:], [-127.0], -ties[1:]]))
    f16 = [2.0**-24, 1.5 * 2**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-14 - 2.0**-25, 2.0**-20, 1 + 2.0**-11,
           1 + 3 * 2.0**-11, 65504.0, 65519.0, 65520.0, 1e5, np.inf, -np.inf, -0.0, 0.0]
    rows.append(np.array(f16 * 4))
    return np.array(rows, np.float32)


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_store_is_bit_identical_to_kv_encode(kv_type, rng):
    x = store_cases(rng)
    if kv_type == "q8_0":
        x = x[np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1) < 1e30)]   # amax / 127 stays a float
    else:
        payloads = np.array([0x7F800001, 0xFFC00123, 0x7FBFE000, 0x7F802000] * 16, np.uint32)   # NaNs
        x = np.concatenate([x, np.full((1, 64), np.nan, np.float32), payloads.view(np.float32)[None]])
    with np.errstate(all="ignore"):
        want = kv_encode(x, kv_type)
    np.testing.assert_array_equal(cpu_lib.kv_store(kv_type, x).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_load_matches_kv_decode(kv_type, rng):
    if kv_type == "f16":
        a = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 64)   # every f16
    else:
        x = store_cases(rng)
        a = kv_encode(x[np.abs(x).max(axis=1) < 1e6], kv_type)   # q8_0: a scale that f16 holds
    got, want = cpu_lib.kv_load(kv_type, a, 64), kv_decode(a, kv_type)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
