"""Every CUDA kernel against its numpy statement (the reference model's ops), on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from common.reference.deltanet import chunked_rule
from common.reference.moe import route
from common.reference.ops import l2_norm, rms_norm, rope_neox, sigmoid, silu
from native.cuda.kernels import GATE_UP_KERNELS, GEMM_BM, GEMM_KERNELS
from native.cuda.tables import rope_table

from .tiny_gguf import weight

GEMM_RTOL = 2e-5        # fp32 sums of K=512 products in another order, relative to |X||W|
GATE_UP_RTOL = 1.1 * GEMM_RTOL  # through silu(g) * u (slope at most 1.1), relative to |X||W|(|g| + |u|)
NORM_ATOL = 2e-5        # rsqrt and exp in fp32 on the device vs numpy
SCAN_ATOL = 5e-4        # chunked delta rule: the reference solves in float64, the kernel inverts in fp32
ATTN_ATOL = 2e-5        # online softmax vs a full softmax, fp32
LONG_ATTN_ATOL = 1e-4   # the same over up to 64k keys: fp32 running sums of that many weights

rng = np.random.default_rng(7)


def dq(raw: np.ndarray, qtype: Q) -> np.ndarray:
    return raw.view(np.float32) if qtype == Q.F32 else dequantize(raw, qtype).astype(np.float32)


def as_raw(data: np.ndarray, raw_dtype) -> tuple[np.ndarray, Q]:
    if raw_dtype is None:
        qtype = Q.F32 if data.dtype == np.float32 else Q.F16
        return data.view(np.uint8).reshape(data.shape[0], -1), qtype
    return data, raw_dtype


def dense_gemm(dev, qtype, T: int, N: int, K: int, Y0: np.ndarray, accumulate: bool):
    """Y0 (rows >= T) on the device, then the dense GEMM of a random [N, K] weight of qtype over T
    random rows in tiles of GEMM_BM: (X, W as float, Y back from the device)."""
    raw, qt = as_raw(*weight(qtype, (N, K), 0.05, rng))
    W = dq(raw, qt).reshape(N, K)
    X = rng.standard_normal((T, K)).astype(np.float32)
    x, w, y = dev.put(X), dev.put(raw), dev.put(Y0)
    starts = np.arange(0, T, GEMM_BM)
    tiles = dev.put(np.array([[0, r, min(GEMM_BM, T - r), 0] for r in starts], np.int32))
    dev.k.gemm(dev.s, qt, x=x, ldx=K, y=y, ldy=N, w=w, row_bytes=raw.shape[1], tiles=tiles,
               n_tiles=len(starts), N=N, K=K, accumulate=accumulate)
    return X, W, dev.get(y, Y0.shape)


@pytest.mark.parametrize("qtype", list(GEMM_KERNELS), ids=lambda q: q.name)
def test_gemm_dense(dev, qtype):
    T, N, K = 70, 200, 512
    Y0 = rng.standard_normal((T, N)).astype(np.float32)
    X, W, got = dense_gemm(dev, qtype, T, N, K, Y0, accumulate=True)
    scale = np.abs(X).sum(1)[:, None] * np.abs(W).max()
    assert np.max(np.abs(got - (Y0 + X @ W.T)) / scale) < GEMM_RTOL


@pytest.mark.parametrize("qtype", list(GEMM_KERNELS), ids=lambda q: q.name)
def test_gemm_model_width_poisoned(dev, qtype):
    """A 35B projection (N 512, K 2048) over 130 rows into NaN: every output written, none twice."""
    T, N, K = 130, 512, 2048
    X, W, got = dense_gemm(dev, qtype, T, N, K, np.full((T + 1, N), np.nan, np.float32), accumulate=False)
    assert np.isnan(got[T]).all()                       # the row past the last tile stays untouched
    scale = np.abs(X).sum(1)[:, None] * np.abs(W).max()
    assert np.max(np.abs(got[:T] - X @ W.T) / scale) < GEMM_RTOL


@pytest.mark.parametrize("qtype", list(GEMM_KERNELS), ids=lambda q: q.name)
def test_gemm_grouped_gather(dev, qtype):
    E, F, H, T = 4, 300, 256, 50                        # F: a partial column block at either tile width
    raw, qt = as_raw(*weight(qtype, (E * F, H), 0.05, rng))
    W = dq(raw, qt).reshape(E, F, H)
    X = rng.standard_normal((T, H)).astype(np.float32)
    rows = np.array([3, 7, 7, 1, 40, 12, 0, 49, 5, 5, 22] * 9, np.int32)      # 99 gathered rows
    groups = [(2, 0, 64), (2, 64, 6), (0, 70, 29)]      # (expert, row0, nrows): full, nearly empty, partial
    base = dev.put(raw)
    eb = raw.nbytes // E
    woff = dev.put(np.array([base + e * eb for e in range(E)], np.int64))
    x, xr, y = dev.put(X), dev.put(rows), dev.zeros((len(rows), F))
    dev.k.gemm(dev.s, qt, x=x, ldx=H, xrows=xr, y=y, ldy=F, w=0, woff=woff, row_bytes=eb // F,
               tiles=dev.put(np.array([[e, r, n, 0] for e, r, n in groups], np.int32)), n_tiles=len(groups), N=F, K=H)
    got = dev.get(y, (len(rows), F))
    for e, r0, n in groups:
        want = X[rows[r0:r0 + n]] @ W[e].T
        np.testing.assert_allclose(got[r0:r0 + n], want, atol=GEMM_RTOL * H * 4 * np.abs(W).max())


@pytest.mark.parametrize("qtype", list(GATE_UP_KERNELS), ids=lambda q: q.name)
def test_gemm_gate_up_experts(dev, qtype):
    """Fused gate/up/SiLU at the 35B's expert widths (F 512, K 2048) over gathered rows into NaN,
    gate and up weights in separate allocations: every routed row written, the row past them not."""
    E, F, H, T = 3, 512, 2048, 60
    (raw_g, qt), (raw_u, _) = (as_raw(*weight(qtype, (E * F, H), 0.05, rng)) for _ in range(2))
    Wg, Wu = (dq(raw, qt).reshape(E, F, H) for raw in (raw_g, raw_u))
    X = rng.standard_normal((T, H)).astype(np.float32)
    rows = rng.integers(0, T, 99).astype(np.int32)
    groups = [(2, 0, 64), (2, 64, 6), (0, 70, 29)]      # (expert, row0, nrows): full, nearly empty, partial
    eb = raw_g.nbytes // E
    woff, woff_up = (dev.put(dev.put(raw) + np.arange(E, dtype=np.int64) * eb) for raw in (raw_g, raw_u))
    y = dev.put(np.full((len(rows) + 1, F), np.nan, np.float32))
    dev.k.gemm_gate_up(dev.s, qt, x=dev.put(X), ldx=H, xrows=dev.put(rows), y=y, ldy=F, woff=woff, woff_up=woff_up,
                       row_bytes=eb // F, tiles=dev.put(np.array([[e, r, n, 0] for e, r, n in groups], np.int32)),
                       n_tiles=len(groups), N=F, K=H)
    got = dev.get(y, (len(rows) + 1, F))
    assert np.isnan(got[-1]).all()
    wmax = max(np.abs(Wg).max(), np.abs(Wu).max())
    for e, r0, n in groups:
        Xe = X[rows[r0:r0 + n]]
        g, u = Xe @ Wg[e].T, Xe @ Wu[e].T
        scale = np.abs(Xe).sum(1)[:, None] * wmax * (np.abs(g) + np.abs(u))
        assert np.max(np.abs(got[r0:r0 + n] - silu(g) * u) / scale) < GATE_UP_RTOL, (e, r0)


def test_rms_norms_and_rope(dev):
    T, nh, hd = 37, 4, 64
    q2 = rng.standard_normal((T, nh, 2 * hd)).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(hd)).astype(np.float32)
    src, out = dev.put(q2), dev.zeros((T, nh, hd))
    dev.k.rms_norm(dev.s, src, nh * 2 * hd, 2 * hd, out, nh * hd, hd, dev.put(w), T * nh, nh, hd, 1e-6)
    want = rms_norm(q2[..., :hd], w, 1e-6)
    np.testing.assert_allclose(dev.get(out, (T, nh, hd)), want, atol=NORM_ATOL)

    pos = np.arange(100, 100 + T)
    dev.k.rope(dev.s, out, nh * hd, nh, hd, 16, dev.put(rope_table(pos, 16, 1e7)), T)
    np.testing.assert_allclose(dev.get(out, (T, nh, hd)), rope_neox(want, pos, 16, 1e7), atol=NORM_ATOL)

    x, z = rng.standard_normal((2, T * nh, hd)).astype(np.float32)
    y = dev.zeros((T * nh, hd))
    dev.k.rms_norm_gated(dev.s, dev.put(x), dev.put(z), y, dev.put(w), T * nh, hd, 1e-6)
    np.testing.assert_allclose(dev.get(y, (T * nh, hd)), rms_norm(x, w, 1e-6) * silu(z), atol=NORM_ATOL)

    qk = rng.standard_normal((T, 3 * 2 * hd)).astype(np.float32)
    p = dev.put(qk)
    dev.k.l2_norm(dev.s, p + 2 * hd * 4, 3 * 2 * hd, T * 2, 2, hd, 1e-6, 0.125)
    got = dev.get(p, (T, 3 * 2 * hd))
    want = l2_norm(qk[:, 2 * hd:4 * hd].reshape(T, 2, hd)).reshape(T, 2 * hd) * 0.125
    np.testing.assert_allclose(got[:, 2 * hd:4 * hd], want, atol=NORM_ATOL)
    np.testing.assert_array_equal(got[:, :2 * hd], qk[:, :2 * hd])


@pytest.mark.parametrize("T", [1, 2, 45])
def test_conv1d_and_gates(dev, T):
    C, K, nv = 96, 4, 8
    X = rng.standard_normal((T, C)).astype(np.float32)
    S = rng.standard_normal((C, K - 1)).astype(np.float32)
    W = rng.standard_normal((C, K)).astype(np.float32)
    xs, ss, out = dev.put(X), dev.put(S), dev.zeros((T, C))
    dev.k.conv1d(dev.s, xs, ss, dev.put(W), out, T, C, K)
    win = np.concatenate([S.T, X], axis=0)
    want = silu(sum(win[j:j + T] * W[:, j] for j in range(K)))
    np.testing.assert_allclose(dev.get(out, (T, C)), want, atol=NORM_ATOL)
    np.testing.assert_array_equal(dev.get(ss, (C, K - 1)), win[-(K - 1):].T)

    a, b = rng.standard_normal((2, T, nv)).astype(np.float32)
    ssm_a, dt = -np.exp(rng.standard_normal(nv)).astype(np.float32), rng.standard_normal(nv).astype(np.float32)
    pa, pb = dev.put(a), dev.put(b)
    dev.k.gdn_gates(dev.s, pa, pb, dev.put(ssm_a), dev.put(dt), T, nv)
    np.testing.assert_allclose(dev.get(pa, (T, nv)), ssm_a * np.logaddexp(0, a + dt), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dev.get(pb, (T, nv)), sigmoid(b), atol=1e-6)


@pytest.mark.parametrize("T,nk,nv,dk,dv,tiled", [(150, 2, 4, 64, 64, 1), (70, 2, 4, 64, 32, 0),
                                                  (64, 1, 2, 128, 128, 1), (5, 2, 4, 32, 64, 1)])
def test_gated_deltanet_chunked(dev, T, nk, nv, dk, dv, tiled):
    C = 2 * nk * dk + nv * dv
    X = rng.standard_normal((T, C)).astype(np.float32)
    heads = np.arange(nv) % nk if tiled else np.arange(nv) // (nv // nk)
    X[:, :nk * dk] = (l2_norm(X[:, :nk * dk].reshape(T, nk, dk)) / np.sqrt(dk)).reshape(T, -1)
    X[:, nk * dk:2 * nk * dk] = l2_norm(X[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)).reshape(T, -1)
    g = (-np.abs(rng.standard_normal((T, nv))) * 0.3).astype(np.float32)
    beta = sigmoid(rng.standard_normal((T, nv)).astype(np.float32))
    S0 = (rng.standard_normal((nv, dk, dv)) * 0.3).astype(np.float32)
    rows = -(-T // 64) * 64
    st, o = dev.put(S0), dev.zeros((T, nv * dv))
    dev.k.gdn_chunked(dev.s, dev.put(X), dev.put(g), dev.put(beta), (T, C, nk, nv, dk, dv, tiled),
                      dev.zeros(rows * nv), dev.zeros(rows * 64 * nv), dev.zeros(rows * nv * dv),
                      dev.zeros(rows * nv * dk), st, o)
    q = X[:, :nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2)
    k = X[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2)
    v = X[:, 2 * nk * dk:].reshape(T, nv, dv).transpose(1, 0, 2)
    want_o, want_s, _ = chunked_rule(q, k, v, g.T, beta.T, S0, 64)
    np.testing.assert_allclose(dev.get(o, (T, nv, dv)), want_o.transpose(1, 0, 2), atol=SCAN_ATOL)
    np.testing.assert_allclose(dev.get(st, (nv, dk, dv)), want_s, atol=SCAN_ATOL)


@pytest.mark.parametrize("T,pos0,nh,nkv,hd", [(40, 30, 4, 2, 64), (70, 0, 2, 1, 256), (1, 9, 4, 2, 32)])
def test_attention(dev, T, pos0, nh, nkv, hd):
    S = pos0 + T
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    kc, vc = rng.standard_normal((2, S, nkv, hd)).astype(np.float32)
    qg = rng.standard_normal((T, nh, 2 * hd)).astype(np.float32)
    out = dev.zeros((T, nh * hd))
    dev.k.attention(dev.s, dev.put(q), dev.put(kc), dev.put(vc), dev.put(qg) + hd * 4, nh * 2 * hd,
                    2 * hd, out, T, pos0, nh, nkv, hd)
    grp = nh // nkv
    sc = np.einsum("thd,shd->hts", q, np.repeat(kc, grp, axis=1)) / np.sqrt(hd)
    sc = np.where((pos0 + np.arange(T))[:, None] >= np.arange(S)[None], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("hts,shd->thd", p, np.repeat(vc, grp, axis=1)) * sigmoid(qg[..., hd:])
    np.testing.assert_allclose(dev.get(out, (T, nh, hd)), want, atol=ATTN_ATOL)


@pytest.mark.parametrize("S", [16384, 65536])
def test_attention_long_prompt(dev, S):
    """A whole prompt of S tokens at the model's head shapes in one call; sampled query rows (the
    first, the last, and spread between) against a float64 softmax over the keys each one sees."""
    nh, nkv, hd = 16, 2, 256
    q = (rng.standard_normal((S, nh, hd), dtype=np.float32) * 2.0)
    kc, vc = rng.standard_normal((2, S, nkv, hd), dtype=np.float32)
    qg = rng.standard_normal((S, nh, 2 * hd), dtype=np.float32)
    out, args = dev.zeros((S, nh * hd)), [dev.put(a) for a in (q, kc, vc, qg)]
    start, end = dev.cuda.Event(), dev.cuda.Event()
    start.record(dev.s)
    dev.k.attention(dev.s, args[0], args[1], args[2], args[3] + hd * 4, nh * 2 * hd, 2 * hd, out, S, 0, nh, nkv, hd)
    end.record(dev.s)
    got = dev.get(out, (S, nh, hd))
    end.synchronize()
    seconds = start.time_till(end) / 1e3
    flops = 4.0 * nh * hd * S * (S + 1) / 2          # QK and PV over the causal triangle
    print(f"attention over {S} tokens: {seconds:.3f} s, {flops / seconds / 1e12:.2f} TFLOP/s")
    grp = nh // nkv
    for t in sorted({0, 1, S // 3, S // 2 + 5, S - 2, S - 1, *rng.integers(0, S, 10).tolist()}):
        kk = np.repeat(kc[:t + 1], grp, axis=1).astype(np.float64)       # (t+1, nh, hd)
        vv = np.repeat(vc[:t + 1], grp, axis=1).astype(np.float64)
        sc = np.einsum("hd,shd->hs", q[t].astype(np.float64), kk) / np.sqrt(hd)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = np.einsum("hs,shd->hd", p, vv) * sigmoid(qg[t, :, hd:].astype(np.float64))
        np.testing.assert_allclose(got[t], want, atol=LONG_ATTN_ATOL, err_msg=f"query row {t} of {S}")


def test_moe_route_group_combine(dev):
    T, E, k, H = 90, 64, 8, 48
    logits = rng.standard_normal((T, E)).astype(np.float32) * 3
    ids, w, counts = dev.zeros((T, k), np.int32), dev.zeros((T, k)), dev.zeros(E, np.int32)
    dev.k.moe_route(dev.s, dev.put(logits), ids, w, T, E, k)
    want_ids, want_w = route(logits, k)
    np.testing.assert_array_equal(dev.get(ids, (T, k), np.int32), want_ids)
    np.testing.assert_allclose(dev.get(w, (T, k)), want_w, atol=1e-6)

    dev.k.moe_count(dev.s, ids, counts, T * k)
    c = dev.get(counts, E, np.int32)
    np.testing.assert_array_equal(c, np.bincount(want_ids.ravel(), minlength=E))
    offsets = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int32)
    tok, pos = dev.zeros(T * k, np.int32), dev.zeros(T * k, np.int32)
    dev.k.moe_scatter(dev.s, ids, dev.put(offsets), tok, pos, T * k, k)
    tok_h, pos_h = dev.get(tok, T * k, np.int32), dev.get(pos, T * k, np.int32)
    flat = want_ids.ravel()
    assert sorted(pos_h) == list(range(T * k))
    np.testing.assert_array_equal(tok_h[pos_h], np.arange(T * k) // k)
    assert all(offsets[flat[i]] <= pos_h[i] < offsets[flat[i]] + c[flat[i]] for i in range(T * k))

    down = rng.standard_normal((T * k, H)).astype(np.float32)
    shared, sg = rng.standard_normal((T, H)).astype(np.float32), rng.standard_normal(T).astype(np.float32)
    x0 = rng.standard_normal((T, H)).astype(np.float32)
    x = dev.put(x0)
    dev.k.moe_combine(dev.s, x, dev.put(down), pos, w, dev.put(shared), dev.put(sg), T, H, k)
    want = x0 + np.einsum("tk,tkh->th", want_w, down[pos_h.reshape(T, k)]) + sigmoid(sg)[:, None] * shared
    np.testing.assert_allclose(dev.get(x, (T, H)), want, atol=1e-5)

    g, u = rng.standard_normal((2, 1000)).astype(np.float32)
    pg = dev.put(g)
    dev.k.silu_mul(dev.s, pg, dev.put(u), pg, 1000)
    np.testing.assert_allclose(dev.get(pg, 1000), silu(g) * u, atol=1e-6)
