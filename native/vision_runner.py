"""The vision tower on the native CPU kernels (native/cpu/vision*.c), with the interface of the numpy
reference (common/reference/vision.py): `NativeVisionEncoder(mmproj).encode(patches)` -> the image's
token embeddings [n_tokens, text hidden].

The weight matrices stay in the mmproj's blocks (f32, f16, bf16 or q8_0: fm_vis_gemm dequantizes a
panel at a time); a matrix of another type is dequantized to f32 once, at load. The patch
embedding's two temporal halves become one f32 matrix, as in the reference. The position grid's
resampling and the rotary's angles are the reference's own functions: they are per image, small,
and the same numbers on both paths.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from common.reference.vision import interpolated_positions, patch_rows_cols, rotary_2d
from common.vision.preprocess import Patches
from common.vision.tensors import MmprojFile

from .cpu_lib import Pool, ffi, lib, ptr

IN_PLACE_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0)
ACT_NONE, ACT_GELU_TANH, ACT_GELU_ERF = 0, 1, 2


@dataclass(frozen=True)
class Matrix:
    """A weight matrix as the GEMM reads it: (rows, cols) in `qtype` blocks, row_bytes a row."""
    qtype: int
    raw: np.ndarray              # (rows, row_bytes) uint8, or (rows, cols) float32
    rows: int
    cols: int
    row_bytes: int

    @classmethod
    def of(cls, t) -> "Matrix":
        rows, cols = t.shape
        if t.qtype in IN_PLACE_TYPES and (t.qtype != Q.Q8_0 or cols % 32 == 0):
            return cls(int(t.qtype), np.ascontiguousarray(t.raw), rows, cols, t.row_bytes)
        return cls.f32(t.dequant())

    @classmethod
    def f32(cls, w: np.ndarray) -> "Matrix":
        w = np.ascontiguousarray(w, np.float32)
        return cls(int(Q.F32), w, w.shape[0], w.shape[1], 4 * w.shape[1])


def gemm(pool: Pool, m: Matrix, x: np.ndarray, bias: np.ndarray | None = None, act: int = ACT_NONE,
         out: np.ndarray | None = None) -> np.ndarray:
    """x [n, cols] -> x W^T + bias [n, rows], activated; added into `out` when given."""
    n = x.shape[0]
    y = np.empty((n, m.rows), np.float32) if out is None else out
    if x.shape[1] != m.cols or y.shape != (n, m.rows) or x.dtype != np.float32 or y.dtype != np.float32:
        raise ValueError(f"a GEMM of {m.rows} x {m.cols} weights takes float32 [n, {m.cols}] into [n, {m.rows}], "
                         f"not {x.dtype} {x.shape} into {y.dtype} {y.shape}")
    rc = lib.fm_vis_gemm(pool.ptr, m.qtype, ptr(m.raw), m.row_bytes, m.rows, m.cols, n,
                         ptr(x, "float *"), x.shape[1], ptr(y, "float *"), y.shape[1],
                         ffi.NULL if bias is None else ptr(bias, "float *"), int(out is not None), act)
    if rc:
        raise ValueError(f"the vision GEMM cannot read a {Q(m.qtype).name} matrix of {m.rows} x {m.cols}")
    return y


def _f32(t) -> np.ndarray:
    return np.ascontiguousarray(t.dequant(), np.float32)


class NativeVisionEncoder:
    """The tower of one mmproj file on the native kernels, over a pool of `threads` threads."""

    def __init__(self, mmproj: MmprojFile, threads: int | None = None, pool: Pool | None = None):
        self.mmproj = mmproj                    # keeps the memory map alive
        self.cfg = cfg = mmproj.config
        self.pool = pool or Pool(threads)
        g = mmproj.bound.globals
        w = np.stack([g["patch0"].dequant(), g["patch1"].dequant()], axis=2)     # [H, 3, 2, P, P]
        self.patch = Matrix.f32(w.reshape(cfg.hidden_size, -1))
        self.vec = {role: _f32(g[role]) for role in ("patch_b", "pos", "post_ln_w", "post_ln_b", "mm0_b", "mm2_b")}
        self.mm0, self.mm2 = Matrix.of(g["mm0_w"]), Matrix.of(g["mm2_w"])
        self.blocks = []
        for b in mmproj.bound.blocks:
            block = {role: _f32(t) for role, t in b.items() if not role.endswith("_w") or role.startswith("ln")}
            block.update({role: Matrix.of(b[role]) for role in ("qkv_w", "out_w", "up_w", "down_w")})
            self.blocks.append(block)

    def layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        y = np.empty_like(x)
        lib.fm_vis_layernorm(self.pool.ptr, ptr(x, "float *"), ptr(y, "float *"), x.shape[0], x.shape[1],
                             ptr(w, "float *"), ptr(b, "float *"), self.cfg.eps)
        return y

    def encode(self, patches: Patches) -> np.ndarray:
        """patches of one image -> its image-token embeddings [n_tokens, text hidden]."""
        cfg, v = self.cfg, self.vec
        patches.check(cfg)
        rows, cols = patch_rows_cols(patches.grid_h, patches.grid_w, cfg.merge_size)
        pixels = np.ascontiguousarray(patches.pixels, np.float32)
        x = gemm(self.pool, self.patch, pixels, v["patch_b"])                                          # [N, H]
        x += interpolated_positions(v["pos"], cfg.grid_side, rows, cols, patches.grid_h, patches.grid_w)
        cos, sin = (np.ascontiguousarray(a, np.float32) for a in rotary_2d(rows, cols, cfg.head_dim, cfg.rope_theta))
        for w in self.blocks:
            self._attention(x, w, cos, sin)
            h = self.layer_norm(x, w["ln2_w"], w["ln2_b"])
            u = gemm(self.pool, w["up_w"], h, w["up_b"], ACT_GELU_TANH)
            gemm(self.pool, w["down_w"], u, w["down_b"], out=x)
        x = self.layer_norm(x, v["post_ln_w"], v["post_ln_b"])
        x = x.reshape(-1, cfg.merge_size ** 2 * cfg.hidden_size)                               # the 2 x 2 merge
        x = gemm(self.pool, self.mm0, x, v["mm0_b"], ACT_GELU_ERF)
        return gemm(self.pool, self.mm2, x, v["mm2_b"])

    def _attention(self, x: np.ndarray, w: dict, cos: np.ndarray, sin: np.ndarray) -> None:
        """x += out_proj(attention(LN1(x))), in place."""
        cfg = self.cfg
        n, nh, hd = x.shape[0], cfg.n_heads, cfg.head_dim
        qkv = gemm(self.pool, w["qkv_w"], self.layer_norm(x, w["ln1_w"], w["ln1_b"]), w["qkv_b"])    # [N, 3H]
        q, k, vv = (np.empty((nh, n, hd), np.float32) for _ in range(3))
        lib.fm_vis_rotary_split(self.pool.ptr, ptr(qkv, "float *"), ptr(cos, "float *"), ptr(sin, "float *"),
                                n, nh, hd, ptr(q, "float *"), ptr(k, "float *"), ptr(vv, "float *"))
        o = np.empty((n, nh * hd), np.float32)
        if lib.fm_vis_attention(self.pool.ptr, ptr(q, "float *"), ptr(k, "float *"), ptr(vv, "float *"), n, nh,
                                hd, 1.0 / float(np.sqrt(hd)), ptr(o, "float *")):
            raise MemoryError("could not allocate the vision attention's work")
        gemm(self.pool, w["out_w"], o, w["out_b"], out=x)
