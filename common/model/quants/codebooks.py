"""The code-book types: 4-bit codes index a table of 16 values. IQ4_NL (32-value blocks, f16
scale), IQ4_XS (256-value blocks, 6-bit scales of 32-value sub-blocks) and MXFP4 (32-value
blocks of E2M1 values, doubled, under a power-of-two E8M0 scale, halved)."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from .blocks32 import f16, nibbles
from .tables import KVALUES_IQ4NL, KVALUES_MXFP4

_IQ4 = KVALUES_IQ4NL.astype(np.float32)          # (16,)
_MXFP4 = KVALUES_MXFP4.astype(np.float32)        # (16,)


def _iq4_nl(b):
    return f16(b[:, 0:2]) * _IQ4[nibbles(b[:, 2:18])]


def _iq4_xs(b):
    n = len(b)
    low = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=-1).reshape(n, 8)
    high = (b[:, 2:4].copy().view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))).astype(np.uint8) & 3
    ls = ((low | (high << 4)).astype(np.int8) - 32).astype(np.float32)
    dl = (f16(b[:, 0:2]) * ls).reshape(n, 8, 1)
    q = nibbles(b[:, 8:136].reshape(n, 8, 16))                        # (n, 8, 32)
    return (dl * _IQ4[q]).reshape(n, 256)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 exponents (uint8) -> 2^(e - 128) as float32: MXFP4's scale over the doubled values."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4(b):
    return e8m0_half(b[:, 0:1]) * _MXFP4[nibbles(b[:, 1:17])]


TYPES = {T.IQ4_NL: (32, 18, _iq4_nl), T.IQ4_XS: (256, 136, _iq4_xs), T.MXFP4: (32, 17, _mxfp4)}
