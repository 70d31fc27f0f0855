"""The numpy float32 reference of the Qwen3.5/3.6 vision tower, from an mmproj file, as transformers'
Qwen3_5MoeVisionModel computes it: the yardstick for the native and GPU encoders.

patches [N, 3*2*P*P] (common/vision/preprocess.py)
  -> patch embedding (the Conv3D as one matmul over both temporal halves) + bias
  -> + the learned position grid, resampled bilinearly (align_corners) to the image's patch grid
  -> blocks: x += attn(LN1(x)) with qkv bias and the 2D rotary; x += fc2(gelu_tanh(fc1(LN2(x))))
  -> the merger: LayerNorm, each 2 x 2 block of patches concatenated, Linear, GELU (erf), Linear
  -> [N / 4, text hidden]
Attention runs over the whole image at once (no window), one image per call.
"""
from __future__ import annotations

import numpy as np

from ..vision.preprocess import Patches
from ..vision.tensors import MmprojFile
from .ops import softmax


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * w + b).astype(np.float32, copy=False)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + 0.044715 * x ** 3)))).astype(np.float32)


def erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 in float64: absolute error under 1.5e-7, below float32's use here
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(np.float32)


def patch_rows_cols(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Each patch's (row, column) in the image, in the tower's order (merge blocks, then within)."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    block = (grid_h // merge, merge, grid_w // merge, merge)
    return rows.reshape(block).transpose(0, 2, 1, 3).reshape(-1), cols.reshape(block).transpose(0, 2, 1, 3).reshape(-1)


def interpolated_positions(pos: np.ndarray, side: int, rows: np.ndarray, cols: np.ndarray,
                           grid_h: int, grid_w: int) -> np.ndarray:
    """The learned [side*side, H] grid resampled bilinearly (align_corners) at each patch: [N, H]."""
    def taps(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        lo = np.floor(src)
        frac = src - lo
        lo = lo.astype(np.int64)
        return np.clip(lo, 0, side - 1), np.clip(lo + 1, 0, side - 1), frac
    h0, h1, fh = taps(rows, grid_h)
    w0, w1, fw = taps(cols, grid_w)
    out = np.zeros((len(rows), pos.shape[1]), np.float32)
    for hi, wh in ((h0, 1 - fh), (h1, fh)):
        for wi, ww in ((w0, 1 - fw), (w1, fw)):
            out += pos[hi * side + wi] * (wh * ww)[:, None]
    return out


def rotary_2d(rows: np.ndarray, cols: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [N, head_dim]: a quarter of the frequencies each for row and column, repeated for rotate-half."""
    quarter = head_dim // 4
    inv_freq = (1.0 / theta ** (np.arange(0, 2 * quarter, 2, dtype=np.float32) / np.float32(2 * quarter)))
    inv_freq = inv_freq.astype(np.float32)
    freqs = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=-1).astype(np.float32)
    angles = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x: [N, heads, hd]; cos, sin: [N, hd]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class VisionEncoder:
    """The tower of one mmproj file, weights dequantized once to float32."""

    def __init__(self, mmproj: MmprojFile):
        self.cfg = mmproj.config
        bound = mmproj.bound
        self.g = {role: t.dequant() for role, t in bound.globals.items()}
        self.blocks = [{role: t.dequant() for role, t in b.items()} for b in bound.blocks]
        cfg = self.cfg
        # the Conv3D's weight as one matrix over a patch's (channel, temporal, row, col) values
        w = np.stack([self.g["patch0"], self.g["patch1"]], axis=2)            # [H, 3, 2, P, P]
        self.patch_w = w.reshape(cfg.hidden_size, -1)

    def encode(self, patches: Patches) -> np.ndarray:
        """patches of one image -> its image-token embeddings [n_tokens, text hidden]."""
        cfg, g = self.cfg, self.g
        patches.check(cfg)
        rows, cols = patch_rows_cols(patches.grid_h, patches.grid_w, cfg.merge_size)
        x = patches.pixels @ self.patch_w.T + g["patch_b"]                      # [N, H]
        x = x + interpolated_positions(g["pos"], cfg.grid_side, rows, cols, patches.grid_h, patches.grid_w)
        cos, sin = rotary_2d(rows, cols, cfg.head_dim, cfg.rope_theta)
        for w in self.blocks:
            x = x + self._attention(layer_norm(x, w["ln1_w"], w["ln1_b"], cfg.eps), w, cos, sin)
            h = layer_norm(x, w["ln2_w"], w["ln2_b"], cfg.eps)
            x = x + gelu_tanh(h @ w["up_w"].T + w["up_b"]) @ w["down_w"].T + w["down_b"]
        x = layer_norm(x, g["post_ln_w"], g["post_ln_b"], cfg.eps)
        x = x.reshape(-1, cfg.merge_size ** 2 * cfg.hidden_size)                # [tokens, merge^2 H]
        x = gelu_erf(x @ g["mm0_w"].T + g["mm0_b"])
        return (x @ g["mm2_w"].T + g["mm2_b"]).astype(np.float32)

    def _attention(self, x: np.ndarray, w: dict, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        n, nh, hd = x.shape[0], cfg.n_heads, cfg.head_dim
        qkv = (x @ w["qkv_w"].T + w["qkv_b"]).reshape(n, 3, nh, hd)
        q, k, v = rotate(qkv[:, 0], cos, sin), rotate(qkv[:, 1], cos, sin), qkv[:, 2]
        out = np.empty((n, nh, hd), np.float32)
        for h in range(nh):                                                   # one head's [N, N] at a time
            scores = (q[:, h] @ k[:, h].T) / np.float32(np.sqrt(hd))
            out[:, h] = softmax(scores) @ v[:, h]
        return out.reshape(n, nh * hd) @ w["out_w"].T + w["out_b"]
