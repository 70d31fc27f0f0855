"""The i-quants: groups of 4 or 8 values read from a grid (common/model/quants/tables.py) by an
index, with signs and 4-bit (IQ1: 3-bit) scales. IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S sign
each value; IQ1_S and IQ1_M shift each group of 8 by +-delta instead.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from .blocks32 import f16
from .tables import IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS

_SEVEN_BITS = np.array([0, 7, 14, 21], np.uint32)


# the 8 signs of every sign byte: bit i set makes value i negative
_SIGN_BYTE = np.where(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=-1, bitorder="little") == 0,
                      np.float32(1), np.float32(-1))                       # (256, 8) float32


def _signs(bits: np.ndarray) -> np.ndarray:
    """(...) sign bytes -> (..., 8) float32 +-1."""
    return _SIGN_BYTE[bits]


def _packed_signs(aux: np.ndarray) -> np.ndarray:
    """(n, groups) uint32 -> (n, groups, 4, 8): four 7-bit sign indices into KSIGNS_IQ2XS."""
    return _signs(KSIGNS_IQ2XS[(aux[..., None] >> _SEVEN_BITS) & 0x7F])


def _nibble_scales(s: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) 4-bit scales, the low nibble first."""
    return np.stack([s & 0x0F, s >> 4], axis=-1).reshape(len(s), -1)


def _iq2_scale(d: np.ndarray, s: np.ndarray) -> np.ndarray:
    return d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(0.25)


def _iq2_xxs(b):
    n = len(b)
    aux = b[:, 2:66].copy().view(np.uint32).reshape(n, 8, 2)        # (grid indices, signs and scale)
    db = _iq2_scale(f16(b[:, 0:2]), aux[..., 1] >> 28).reshape(n, 8, 1, 1)
    idx = b[:, 2:66].reshape(n, 8, 8)[:, :, 0:4]                        # (n, 8, 4)
    grid = IQ2XXS_GRID[idx].astype(np.float32)                          # (n, 8, 4, 8)
    return (db * grid * _packed_signs(aux[..., 1])).reshape(n, 256)


def _iq2_xs(b):
    n = len(b)
    qs = b[:, 2:66].copy().view(np.uint16)                              # (n, 32): 9-bit index, 7-bit signs
    db = _iq2_scale(f16(b[:, 0:2]), _nibble_scales(b[:, 66:74])).reshape(n, 16, 1, 1)
    grid = IQ2XS_GRID[qs & 511].astype(np.float32).reshape(n, 16, 2, 8)
    signs = _signs(KSIGNS_IQ2XS[qs >> 9]).reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, 256)


def _iq2_s(b):
    n = len(b)
    db = _iq2_scale(f16(b[:, 0:2]), _nibble_scales(b[:, 74:82])).reshape(n, 16, 1, 1)
    high = (b[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3              # (n, 8, 4)
    idx = b[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << 8)
    grid = IQ2S_GRID[idx].astype(np.float32).reshape(n, 16, 2, 8)
    return (db * grid * _signs(b[:, 34:66]).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq3_xxs(b):
    n = len(b)
    aux = b[:, 66:98].copy().view(np.uint32)                            # (n, 8): signs and scale
    db = (f16(b[:, 0:2]) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5))
    grid = IQ3XXS_GRID[b[:, 2:66]].astype(np.float32).reshape(n, 8, 4, 8)
    return (db.reshape(n, 8, 1, 1) * grid * _packed_signs(aux)).reshape(n, 256)


def _iq3_s(b):
    n = len(b)
    db = (f16(b[:, 0:2]) * (1 + 2 * _nibble_scales(b[:, 106:110])).astype(np.float32)).reshape(n, 8, 1, 1)
    high = np.unpackbits(b[:, 66:74], axis=-1, bitorder="little").astype(np.uint16)   # (n, 64)
    grid = IQ3S_GRID[b[:, 2:66].astype(np.uint16) | (high << 8)].astype(np.float32).reshape(n, 8, 4, 8)
    return (db * grid * _signs(b[:, 74:106]).reshape(n, 8, 4, 8)).reshape(n, 256)


def _shifted(grid_idx: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """IQ1: the grid's -1/0/1 values plus delta (minus delta where `negative`), float32 (..., 8)."""
    delta = np.where(negative, np.float32(-IQ1S_DELTA), np.float32(IQ1S_DELTA))[..., None]
    return IQ1S_GRID[grid_idx].astype(np.float32) + delta


def _iq1_s(b):
    n = len(b)
    qh = b[:, 34:50].copy().view(np.uint16)                             # (n, 8)
    dl = (f16(b[:, 0:2]) * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)).reshape(n, 8, 1, 1)
    high = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7     # (n, 8, 4)
    idx = b[:, 2:34].reshape(n, 8, 4).astype(np.uint16) | (high << 8)
    return (dl * _shifted(idx, ((qh & 0x8000) != 0)[..., None])).reshape(n, 256)


def _iq1_m(b):
    n = len(b)
    s = b[:, 48:56].copy().view(np.uint16)                              # (n, 4): 3-bit scales, f16 d on top
    top = (s & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)
    d = (top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]).view(np.float16).astype(np.float32).reshape(n, 1)
    sc = ((s[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = (d * (2 * sc + 1).astype(np.float32)).reshape(n, 8, 2, 1, 1)
    nib = np.stack([b[:, 32:48] & 0x0F, b[:, 32:48] >> 4], axis=-1).reshape(n, 32)    # per group of 8
    idx = b[:, 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    vals = _shifted(idx, (nib & 8) != 0).reshape(n, 8, 2, 2, 8)
    return (dl * vals).reshape(n, 256)


TYPES = {T.IQ2_XXS: (256, 66, _iq2_xxs), T.IQ2_XS: (256, 74, _iq2_xs), T.IQ2_S: (256, 82, _iq2_s),
         T.IQ3_XXS: (256, 98, _iq3_xxs), T.IQ3_S: (256, 110, _iq3_s),
         T.IQ1_S: (256, 50, _iq1_s), T.IQ1_M: (256, 56, _iq1_m)}
