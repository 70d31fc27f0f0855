"""The K-quants: 256-value super-blocks of 16 or 32-value sub-blocks with 4- to 8-bit scales.

Q2_K, Q3_K and Q6_K scale 16 sub-blocks of 16 values; Q4_K and Q5_K scale 8 sub-blocks of 32 and
subtract a per-sub-block minimum. Low bits of 32 consecutive values share a byte column: value
l of group g sits in byte l (and the groups that share it) shifted by g's position.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from .blocks32 import f16


def _split(b: np.ndarray, bits: int, groups: int, width: int) -> np.ndarray:
    """(n, bytes) -> (n, groups * bytes / width, width): each byte column's `bits`-bit fields,
    the lowest first, over consecutive `width`-byte rows."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    q = (b.reshape(len(b), -1, 1, width) >> shifts) & np.uint8((1 << bits) - 1)
    return q.reshape(len(b), groups, -1)


def k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> the 8 six-bit scales and 8 six-bit minimums, (n, 8) each."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _q2_k(b):
    n, s = len(b), b[:, 0:16]
    dl = (f16(b[:, 80:82]) * (s & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    ml = (f16(b[:, 82:84]) * (s >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _split(b[:, 16:80], 2, 16, 32).astype(np.float32)          # (n, 16, 16)
    return (dl * q - ml).reshape(n, 256)


def _q3_k(b):
    n, s = len(b), b[:, 96:108]
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=-1)       # (n, 16)
    high = _split(s[:, 8:12], 2, 16, 4).reshape(n, 16)                    # (n, 16)
    sc = ((low | (high << 4)).astype(np.int8) - 32).astype(np.float32)
    dl = (f16(b[:, 108:110]) * sc).reshape(n, 16, 1)
    ql = _split(b[:, 32:96], 2, 16, 32)                                   # (n, 16, 16)
    # a clear high bit subtracts 4
    qh = _split(b[:, 0:32], 1, 16, 32) ^ np.uint8(1)
    q = (ql.astype(np.int8) - (qh << 2).astype(np.int8)).astype(np.float32)
    return (dl * q).reshape(n, 256)


def _scaled_min(b, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: d * scale * q - dmin * min over 8 sub-blocks; q (n, 8, 32) float32."""
    n = len(b)
    sc, mn = k_scales(b[:, 4:16])
    d = (f16(b[:, 0:2]) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (f16(b[:, 2:4]) * mn.astype(np.float32)).reshape(n, 8, 1)
    return (d * q - dm).reshape(n, 256)


def _q4_k(b):
    return _scaled_min(b, _split(b[:, 16:144], 4, 8, 32).astype(np.float32))


def _q5_k(b):
    q = _split(b[:, 48:176], 4, 8, 32) | (_split(b[:, 16:48], 1, 8, 32) << 4)
    return _scaled_min(b, q.astype(np.float32))


def _q6_k(b):
    n = len(b)
    ql = _split(b[:, 0:128], 4, 8, 64).reshape(n, 8, 32)
    qh = _split(b[:, 128:192], 2, 8, 32)
    q = ((ql | (qh << 4)).astype(np.int8) - 32).reshape(n, 16, 16).astype(np.float32)
    d = (f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    return (d * q).reshape(n, 256)


TYPES = {T.Q2_K: (256, 84, _q2_k), T.Q3_K: (256, 110, _q3_k), T.Q4_K: (256, 144, _q4_k),
         T.Q5_K: (256, 176, _q5_k), T.Q6_K: (256, 210, _q6_k)}
