"""Numpy quantizers for the K-quant types that gguf-py can only dequantize: Q4_K, Q5_K, Q6_K.

A super-block holds 256 values. Byte layouts are those that `gguf.quants.dequantize` reads:

    Q4_K (144 B): d f16 | dmin f16 | scales[12] (6-bit scale and min per 32 values) | qs[128]
    Q5_K (176 B): d f16 | dmin f16 | scales[12] | qh[32] (5th bits) | qs[128]
    Q6_K (210 B): ql[128] | qh[64] | scales[16] int8 (per 16 values) | d f16

Q4_K/Q5_K sub-blocks are asymmetric, x ~ scale * q - min, with scale and min chosen by a
weighted least-squares search over candidate grids; Q6_K sub-blocks are symmetric with a
search over the scale. Every function takes rows whose length is a multiple of 256 and
returns (*rows, row_bytes) uint8.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

QK_K = 256
CHUNK_BLOCKS = 8192          # super-blocks quantized at once, to bound temporary memory
WORKERS = min(8, os.cpu_count() or 1)   # numpy releases the GIL inside its loops


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _fit_asymmetric(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """x: [n, 32] -> (scale [n], min [n] >= 0) minimising sum w (scale*q - min - x)^2."""
    w = np.sqrt(np.mean(x * x, axis=1, keepdims=True)) + np.abs(x)
    lo = np.minimum(x.min(axis=1), 0.0)
    span = x.max(axis=1) - lo
    flat = span <= 0
    span = np.where(flat, 1.0, span)
    shifted = x - lo[:, None]
    sw, sx, sx2 = w.sum(axis=1), (w * x).sum(axis=1), (w * x * x).sum(axis=1)

    def err(scale, mn, sl, sl2, sxl):
        # sum w (scale q + mn - x)^2, expanded over the sums
        return (scale * scale * sl2 + 2 * scale * mn * sl - 2 * scale * sxl
                + mn * mn * sw - 2 * mn * sx + sx2)

    def sums(q):
        wq = w * q
        return wq.sum(axis=1), (wq * q).sum(axis=1), (wq * x).sum(axis=1)

    best_scale, best_min = span / nmax, lo
    best_err = err(best_scale, best_min,
                   *sums(np.clip(np.rint(shifted * (nmax / span)[:, None]), 0, nmax)))
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / span
        sl, sl2, sxl = sums(np.clip(np.rint(shifted * iscale[:, None]), 0, nmax))
        det = sw * sl2 - sl * sl
        ok = det > 0
        det = np.where(ok, det, 1.0)
        scale = (sw * sxl - sx * sl) / det
        mn = (sl2 * sx - sl * sxl) / det
        pos = mn > 0                     # the offset may only lower values: refit through 0
        scale = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1.0), scale)
        mn = np.where(pos, 0.0, mn)
        e = err(scale, mn, sl, sl2, sxl)
        better = ok & (e < best_err)
        best_err = np.where(better, e, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, mn, best_min)
    best_scale = np.where(flat, 0.0, best_scale)
    return best_scale, -best_min


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """sc, mn: [nb, 8] 6-bit values -> [nb, 12] as Q4_K/Q5_K store them."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _asymmetric_blocks(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """x: [nb, 256] -> (d f16 [nb], dmin f16 [nb], packed scales [nb, 12], q [nb, 8, 32])."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    scale, mn = _fit_asymmetric(sub, nmax, rmin, rdelta, nstep)
    scale, mn = scale.reshape(nb, 8), mn.reshape(nb, 8)
    max_scale, max_min = scale.max(axis=1), mn.max(axis=1)
    d = _f16(max_scale / 63)
    dmin = _f16(max_min / 63)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where(max_scale[:, None] > 0, np.rint(scale * 63 / max_scale[:, None]), 0)
        lm = np.where(max_min[:, None] > 0, np.rint(mn * 63 / max_min[:, None]), 0)
    ls, lm = np.clip(ls, 0, 63), np.clip(lm, 0, 63)
    # requantize against the scales as they will be decoded
    dd = (d.astype(np.float32)[:, None] * ls)[:, :, None]
    dm = (dmin.astype(np.float32)[:, None] * lm)[:, :, None]
    xs = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dd > 0, np.rint((xs + dm) / dd), 0)
    q = np.clip(q, 0, nmax).astype(np.uint8)
    return d, dmin, _pack_scales_k4(ls, lm), q


def _nibbles(q: np.ndarray) -> np.ndarray:
    """q: [nb, 8, 32] 4-bit -> qs [nb, 128]: sub-blocks 2c, 2c+1 share bytes 32c..32c+31."""
    q = q.reshape(q.shape[0], 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], 128)


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _asymmetric_blocks(x, 15, -1.0, 0.1, 20)
    return np.concatenate([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), scales,
                           _nibbles(q)], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _asymmetric_blocks(x, 31, -0.5, 0.1, 15)
    high = (q >> 4).astype(np.uint8)                              # [nb, 8, 32]
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    return np.concatenate([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), scales,
                           qh, _nibbles(q & 0x0F)], axis=1)


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """x: [n, 16] -> scale [n] (signed) for q = round(x / scale) in [-nmax, nmax - 1]."""
    w = x * x
    idx = np.argmax(np.abs(x), axis=1)
    peak = np.take_along_axis(x, idx[:, None], axis=1)[:, 0]
    zero = peak == 0
    peak = np.where(zero, 1.0, peak)
    best_scale = np.zeros(x.shape[0])
    best_score = np.full(x.shape[0], -1.0)
    for step in range(-9, 10):
        iscale = -(nmax + 0.1 * step) / peak
        q = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        sxl, sl2 = (w * x * q).sum(axis=1), (w * q * q).sum(axis=1)
        ok = sl2 > 0
        sl2 = np.where(ok, sl2, 1.0)
        score = np.where(ok, sxl * sxl / sl2, -1.0)        # error reduction at the best scale
        better = score > best_score
        best_score = np.where(better, score, best_score)
        best_scale = np.where(better, sxl / sl2, best_scale)
    return np.where(zero, 0.0, best_scale)


def _q6_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    scale = _fit_symmetric(x.reshape(nb * 16, 16), 32).reshape(nb, 16)
    idx = np.argmax(np.abs(scale), axis=1)
    peak = np.take_along_axis(scale, idx[:, None], axis=1)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(peak != 0, -128.0 / peak, 0.0)
    d = _f16(np.where(iscale != 0, 1.0 / np.where(iscale != 0, iscale, 1.0), 0.0))
    sc = np.clip(np.rint(iscale[:, None] * scale), -128, 127).astype(np.int8)
    eff = (d.astype(np.float32)[:, None] * sc)[:, :, None]     # [nb, 16, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(eff != 0, np.rint(x.reshape(nb, 16, 16) / eff), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, 256)
    lo, hi = q & 0x0F, q >> 4
    lo = lo.reshape(nb, 2, 2, 64)
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(nb, 128)
    hi = hi.reshape(nb, 2, 4, 32)
    qh = np.bitwise_or.reduce(hi << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None],
                              axis=2).reshape(nb, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d[:, None].view(np.uint8)], axis=1)


_BLOCK_FUNCS = {"Q4_K": (_q4_k, 144), "Q5_K": (_q5_k, 176), "Q6_K": (_q6_k, 210)}


def quantize_k(rows: np.ndarray, kind: str) -> np.ndarray:
    """rows: [..., n] float, n % 256 == 0 -> [..., n // 256 * block_bytes] uint8."""
    func, nbytes = _BLOCK_FUNCS[kind]
    if rows.shape[-1] % QK_K:
        raise ValueError(f"{kind} needs rows that are a multiple of {QK_K}, got {rows.shape[-1]}")
    blocks = np.asarray(rows, dtype=np.float32).reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], nbytes), np.uint8)
    starts = range(0, blocks.shape[0], CHUNK_BLOCKS)

    def run(i: int) -> None:
        out[i:i + CHUNK_BLOCKS] = func(blocks[i:i + CHUNK_BLOCKS])

    if len(starts) == 1:
        run(0)
    else:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(run, starts))
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * nbytes)
