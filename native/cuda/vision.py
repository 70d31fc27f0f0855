"""The vision tower on the prefill GPU (native/cuda/vision.cu), with the interface of the numpy
reference (common/reference/vision.py): `CudaVisionEncoder(mmproj).encode(patches)` -> the image's
token embeddings [n_tokens, text hidden].

The caller holds a current CUDA context (the prefill backend's, or a test's). The whole tower is
uploaded once, its matrices in the mmproj's blocks (f32, f16, bf16 or q8_0; another type, or a width
that the GEMM cannot read in place, is widened to f32 at load, as native/vision_runner.py does).
The position grid's resampling and the rotary's angles are computed on the host by the reference's
own functions (per image and small), the rest on the device, on one stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from common.reference.vision import interpolated_positions, patch_rows_cols, rotary_2d
from common.vision.preprocess import Patches
from common.vision.tensors import MmprojFile

from .kernels import CUDA_DIR, NVCC_OPTIONS, KernelError

GEMM = {Q.F32: "vis_gemm_f32", Q.F16: "vis_gemm_f16", Q.BF16: "vis_gemm_bf16", Q.Q8_0: "vis_gemm_q8_0"}
SIGNATURES = {**{name: "PiPiPqPiiiii" for name in GEMM.values()}, "vis_layernorm": "PPPPif",
              "vis_rotary_split": "PPPPPPiii", "vis_attention": "PPPPiiif"}
THREADS, TILE, ATT_Q, ATT_MAX_HD = 256, 64, 16, 128
ACT_NONE, ACT_GELU_TANH, ACT_GELU_ERF = 0, 1, 2       # vision.cu's VIS_ACT_*


@dataclass(frozen=True)
class DeviceMatrix:
    qtype: Q
    ptr: int                     # rows of row_bytes on the device
    rows: int
    cols: int
    row_bytes: int


def readable(qtype: Q, cols: int) -> bool:
    """Whether the GEMM reads a matrix of this type and width in place."""
    return qtype in GEMM and cols % 8 == 0 and (qtype != Q.Q8_0 or cols % 32 == 0)


class VisionKernels:
    """vision.cu compiled once, with one wrapper per kernel."""

    def __init__(self):
        from pycuda.compiler import SourceModule
        module = SourceModule((CUDA_DIR / "vision.cu").read_text(), options=NVCC_OPTIONS,
                              include_dirs=[str(CUDA_DIR)], no_extern_c=True)
        self.fn = {}
        for name, fmt in SIGNATURES.items():
            self.fn[name] = module.get_function(name)
            self.fn[name].prepare(fmt)

    def gemm(self, stream, qtype: int, *, x: int, ldx: int, y: int, ldy: int, w: int, row_bytes: int,
             bias: int, n: int, rows: int, cols: int, accumulate: bool = False, act: int = ACT_NONE) -> None:
        if not readable(Q(qtype), cols):
            raise KernelError(f"the vision GEMM reads widths of whole 8s (32s for Q8_0), not {cols}")
        self.fn[GEMM[Q(qtype)]].prepared_async_call((-(-rows // TILE), -(-n // TILE), 1), (THREADS, 1, 1), stream,
                                                    x, ldx, y, ldy, w, row_bytes, bias, n, rows, cols,
                                                    int(accumulate), act)

    def layer_norm(self, stream, x: int, y: int, w: int, b: int, n: int, dim: int, eps: float) -> None:
        self.fn["vis_layernorm"].prepared_async_call((n, 1, 1), (THREADS, 1, 1), stream, x, y, w, b, dim,
                                                     np.float32(eps))

    def rotary_split(self, stream, qkv: int, cos: int, sin: int, q: int, k: int, v: int, n: int, heads: int,
                     hd: int) -> None:
        self.fn["vis_rotary_split"].prepared_async_call((-(-n * heads * hd // THREADS), 1, 1), (THREADS, 1, 1),
                                                        stream, qkv, cos, sin, q, k, v, n, heads, hd)

    def attention(self, stream, q: int, k: int, v: int, o: int, n: int, heads: int, hd: int) -> None:
        if hd > ATT_MAX_HD:
            raise KernelError(f"the vision attention takes heads of at most {ATT_MAX_HD}, not {hd}")
        self.fn["vis_attention"].prepared_async_call((-(-n // ATT_Q), heads, 1), (THREADS, 1, 1), stream,
                                                     q, k, v, o, n, heads, hd, np.float32(1.0 / np.sqrt(hd)))


class CudaVisionEncoder:
    """The tower of one mmproj file on the current CUDA context."""

    def __init__(self, mmproj: MmprojFile, kernels: VisionKernels | None = None, driver=None):
        if driver is None:
            import pycuda.driver as driver
        self.cuda, self.cfg = driver, mmproj.config       # driver: pycuda.driver, or a test's stand-in
        self.k = kernels or VisionKernels()
        self.stream = driver.Stream()
        self._mem: list = []
        g = mmproj.bound.globals
        w = np.stack([g["patch0"].dequant(), g["patch1"].dequant()], axis=2)          # [H, 3, 2, P, P]
        self.patch = self._f32_matrix(w.reshape(self.cfg.hidden_size, -1))
        self.pos = g["pos"].dequant()
        self.vec = {r: self._put(g[r].dequant()) for r in ("patch_b", "post_ln_w", "post_ln_b", "mm0_b", "mm2_b")}
        self.mm0, self.mm2 = self._matrix(g["mm0_w"]), self._matrix(g["mm2_w"])
        self.blocks = []
        for b in mmproj.bound.blocks:
            block = {r: self._put(t.dequant()) for r, t in b.items() if not r.endswith("_w") or r.startswith("ln")}
            block.update({r: self._matrix(b[r]) for r in ("qkv_w", "out_w", "up_w", "down_w")})
            self.blocks.append(block)

    def _put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        mem = self.cuda.mem_alloc(max(a.nbytes, 4))
        self.cuda.memcpy_htod(mem, a)
        self._mem.append(mem)
        return int(mem)

    def _matrix(self, t) -> DeviceMatrix:
        rows, cols = t.shape
        if not readable(t.qtype, cols):
            return self._f32_matrix(t.dequant())
        return DeviceMatrix(Q(t.qtype), self._put(t.raw), rows, cols, t.row_bytes)

    def _f32_matrix(self, w: np.ndarray) -> DeviceMatrix:
        w = np.ascontiguousarray(w, np.float32)
        return DeviceMatrix(Q.F32, self._put(w), w.shape[0], w.shape[1], 4 * w.shape[1])

    def free(self) -> None:
        for mem in self._mem:
            mem.free()
        self._mem.clear()

    def _gemm(self, m: DeviceMatrix, x: int, y: int, n: int, bias: int, accumulate=False, act=ACT_NONE):
        self.k.gemm(self.stream, m.qtype, x=x, ldx=m.cols, y=y, ldy=m.rows, w=m.ptr, row_bytes=m.row_bytes,
                    bias=bias, n=n, rows=m.rows, cols=m.cols, accumulate=accumulate, act=act)

    def encode(self, patches: Patches) -> np.ndarray:
        """patches of one image -> its image-token embeddings [n_tokens, text hidden]."""
        cfg, cuda = self.cfg, self.cuda
        if patches.pixels.shape[1] != cfg.patch_dim or patches.merge != cfg.merge_size:
            raise ValueError(f"patches of {patches.pixels.shape[1]} values (merge {patches.merge}); this tower "
                             f"takes {cfg.patch_dim} (merge {cfg.merge_size})")
        n, H, F, nh, hd = patches.pixels.shape[0], cfg.hidden_size, cfg.ffn_size, cfg.n_heads, cfg.head_dim
        tokens, M, D = n // cfg.merge_size ** 2, cfg.merge_size ** 2 * H, cfg.projection_dim
        rows, cols = patch_rows_cols(patches.grid_h, patches.grid_w, cfg.merge_size)
        pos = interpolated_positions(self.pos, cfg.grid_side, rows, cols, patches.grid_h, patches.grid_w)
        cos, sin = rotary_2d(rows, cols, hd, cfg.rope_theta)
        f32 = np.dtype(np.float32).itemsize
        scratch = [cuda.mem_alloc(nbytes * f32) for nbytes in
                   (n * H, n * H, n * 3 * H, 3 * n * H, n * H, n * F, tokens * M, tokens * D)]
        x, h, qkv, planes, o, u, m, out = (int(s) for s in scratch)
        host = [np.ascontiguousarray(a, np.float32) for a in (patches.pixels, pos, cos, sin)]
        dev = [cuda.mem_alloc(a.nbytes) for a in host]
        for d, a in zip(dev, host):
            cuda.memcpy_htod(d, a)
        pixels, cs, sn = int(dev[0]), int(dev[2]), int(dev[3])
        q, k, v = planes, planes + n * H * f32, planes + 2 * n * H * f32
        try:
            cuda.memcpy_dtod_async(x, dev[1], n * H * f32, self.stream)           # x = positions
            self._gemm(self.patch, pixels, x, n, self.vec["patch_b"], accumulate=True)
            for w in self.blocks:
                self.k.layer_norm(self.stream, x, h, w["ln1_w"], w["ln1_b"], n, H, cfg.eps)
                self._gemm(w["qkv_w"], h, qkv, n, w["qkv_b"])
                self.k.rotary_split(self.stream, qkv, cs, sn, q, k, v, n, nh, hd)
                self.k.attention(self.stream, q, k, v, o, n, nh, hd)
                self._gemm(w["out_w"], o, x, n, w["out_b"], accumulate=True)
                self.k.layer_norm(self.stream, x, h, w["ln2_w"], w["ln2_b"], n, H, cfg.eps)
                self._gemm(w["up_w"], h, u, n, w["up_b"], act=ACT_GELU_TANH)
                self._gemm(w["down_w"], u, x, n, w["down_b"], accumulate=True)
            self.k.layer_norm(self.stream, x, h, self.vec["post_ln_w"], self.vec["post_ln_b"], n, H, cfg.eps)
            self._gemm(self.mm0, h, m, tokens, self.vec["mm0_b"], act=ACT_GELU_ERF)   # h as [tokens, M]
            self._gemm(self.mm2, m, out, tokens, self.vec["mm2_b"])
            self.stream.synchronize()
            result = np.empty((tokens, D), np.float32)
            cuda.memcpy_dtoh(result, out)
            return result
        finally:
            self.stream.synchronize()
            for s in scratch + dev:
                s.free()
