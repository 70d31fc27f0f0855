"""Elementwise and normalisation ops of the reference model, float32 numpy."""
from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    # x: [..., d]; w is stored ready to multiply (GGUF keeps zero-centred norms as 1 + w)
    x = x.astype(np.float32, copy=False)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def l2_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x).astype(np.float32, copy=False)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope_neox(x: np.ndarray, positions: np.ndarray, rope_dim: int, theta: float) -> np.ndarray:
    """Rotate-half RoPE on the first `rope_dim` dims of each head. x: [T, heads, head_dim]."""
    half = rope_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]       # [T, half]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rope_dim]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rope_dim] = x2 * cos + x1 * sin
    return out


def mrope_axes(rope_dim: int, sections: tuple[int, ...]) -> np.ndarray:
    """Which position (0 T, 1 H, 2 W) each of the rope_dim / 2 frequencies follows: interleaved, as
    transformers' Qwen3.5 does it: frequency j is H when j % 3 == 1 and j < 3 * sections[1], W when
    j % 3 == 2 and j < 3 * sections[2], else T. llama.cpp's IMROPE gives the same when the sections
    sum to rope_dim / 2, as Qwen3.5/3.6's [11, 11, 10] do (ReferenceModel checks it)."""
    j = np.arange(rope_dim // 2)
    axes = np.zeros(rope_dim // 2, np.int64)
    axes[(j % 3 == 1) & (j < 3 * sections[1])] = 1
    axes[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    return axes


def rope_mrope(x: np.ndarray, positions: np.ndarray, rope_dim: int, theta: float,
               sections: tuple[int, ...]) -> np.ndarray:
    """rope_neox with a (T, H, W) position per token: positions [3, T]; x: [T, heads, head_dim].
    With T = H = W it is rope_neox at that position."""
    half = rope_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    pos = positions.astype(np.float64)[mrope_axes(rope_dim, sections)].T      # [T, half]: each frequency's axis
    angles = pos * inv_freq[None, :]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rope_dim]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rope_dim] = x2 * cos + x1 * sin
    return out
