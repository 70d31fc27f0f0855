"""The ternary types: values -1, 0 and 1 under one f16 scale per 256. TQ2_0 keeps 2 bits a value;
TQ1_0 packs 5 (or 4) base-3 digits a byte as a fixed-point fraction of 243 (81), read by
multiplying the byte by 3^i (mod 256) and taking the top of byte * 3."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from .blocks32 import f16

_POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _digits(qs: np.ndarray, powers: int) -> np.ndarray:
    """(n, k) bytes -> (n, powers * k) digits 0..2, digit i of every byte before digit i + 1."""
    shifted = qs[:, None, :] * _POW3[:powers].reshape(1, -1, 1)       # (n, powers, k), mod 256
    return ((shifted.astype(np.uint16) * 3) >> 8).reshape(len(qs), -1)


def _tq1_0(b):
    q = np.concatenate([_digits(b[:, 0:32], 5), _digits(b[:, 32:48], 5), _digits(b[:, 48:52], 4)], axis=-1)
    return f16(b[:, 52:54]) * (q.astype(np.int8) - 1).astype(np.float32)


def _tq2_0(b):
    q = (b[:, 0:64].reshape(len(b), 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    return f16(b[:, 64:66]) * (q.reshape(len(b), 256).astype(np.int8) - 1).astype(np.float32)


TYPES = {T.TQ1_0: (256, 54, _tq1_0), T.TQ2_0: (256, 66, _tq2_0)}
