"""Host-side tables that the CUDA kernels read: the attention's query tiles and the rotary
table, each frequency of an mRoPE prompt following its axis."""
from __future__ import annotations

import numpy as np

from common.reference.ops import mrope_axes


def dense_tiles(T: int) -> np.ndarray:
    starts = np.arange(0, T, 64)
    return np.stack([np.zeros_like(starts), starts, np.minimum(64, T - starts),
                     np.zeros_like(starts)], axis=1).astype(np.int32)


def rope_table(positions: np.ndarray, rope_dim: int, theta: float, sections: tuple[int, ...] = ()) -> np.ndarray:
    """[T, rope_dim/2, 2] (cos, sin), computed in float64 like the reference. positions: [T], or
    [3, T] mRoPE positions (T, H, W), each frequency following its axis of `sections`."""
    half = rope_dim // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    if positions.ndim == 2:
        pos = positions.astype(np.float64)[mrope_axes(rope_dim, sections)].T            # [T, half]
    else:
        pos = positions.astype(np.float64)[:, None]
    ang = pos * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)
