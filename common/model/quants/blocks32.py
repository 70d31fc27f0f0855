"""The 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

A block opens with an f16 scale d (and, for the _1 types, an f16 offset m); value j < 16 is the
low nibble of byte j, value j >= 16 the high nibble of byte j - 16; Q5 adds a fifth bit, bit j
of a little-endian uint32.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T


def f16(b: np.ndarray) -> np.ndarray:
    """(n, 2k) uint8 -> (n, k) float32: k f16 fields."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) codes: the 16 low nibbles, then the 16 high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes -> (n, 32): bit j of the little-endian uint32, times 16."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << 4


def _q4_0(b):
    return f16(b[:, 0:2]) * (nibbles(b[:, 2:]).astype(np.int8) - 8).astype(np.float32)


def _q4_1(b):
    return f16(b[:, 0:2]) * nibbles(b[:, 4:]).astype(np.float32) + f16(b[:, 2:4])


def _q5_0(b):
    q = (nibbles(b[:, 6:]) | _fifth_bits(b[:, 2:6])).astype(np.int8) - 16
    return f16(b[:, 0:2]) * q.astype(np.float32)


def _q5_1(b):
    q = nibbles(b[:, 8:]) | _fifth_bits(b[:, 4:8])
    return f16(b[:, 0:2]) * q.astype(np.float32) + f16(b[:, 2:4])


def _q8_0(b):
    return np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32) * f16(b[:, 0:2])


TYPES = {T.Q4_0: (32, 18, _q4_0), T.Q4_1: (32, 20, _q4_1), T.Q5_0: (32, 22, _q5_0),
         T.Q5_1: (32, 24, _q5_1), T.Q8_0: (32, 34, _q8_0)}
