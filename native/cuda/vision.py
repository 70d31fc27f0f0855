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
from common.vision.config import VisionConfig
from common.vision.preprocess import Patches
from common.vision.tensors import MmprojFile

from .kernels import CUDA_DIR, NVCC_OPTIONS, KernelError

GEMM = {Q.F32: "vis_gemm_f32", Q.F16: "vis_gemm_f16", Q.BF16: "vis_gemm_bf16", Q.Q8_0: "vis_gemm_q8_0"}
SIGNATURES = {**{name: "PiPiPqPiiiii" for name in GEMM.values()}, "vis_layernorm": "PPPPif",
              "vis_rotary_split": "PPPPPPiii", "vis_attention": "PPPPiiif"}
THREADS, TILE, ATT_Q, ATT_MAX_HD = 256, 64, 16, 128
F32, ALIGN = 4, 256
GLOBAL_VECTORS = ("patch_b", "post_ln_w", "post_ln_b", "mm0_b", "mm2_b")
BLOCK_MATRICES = ("qkv_w", "out_w", "up_w", "down_w")
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


def _aligned(nbytes: int) -> int:
    return -(-max(int(nbytes), 4) // ALIGN) * ALIGN


def max_patches(cfg: VisionConfig) -> int:
    """The patches of the largest image the tower takes (its max_pixels)."""
    return cfg.max_pixels // cfg.patch_size ** 2


def scratch_layout(cfg: VisionConfig, n: int) -> tuple[dict[str, int], int]:
    """Byte offsets of one image's device buffers for n patches, in one allocation, and its size."""
    H, hd, tokens = cfg.hidden_size, cfg.head_dim, n // cfg.merge_size ** 2
    floats = {"x": n * H, "h": n * H, "qkv": 3 * n * H, "planes": 3 * n * H, "o": n * H, "u": n * cfg.ffn_size,
              "m": tokens * cfg.merge_size ** 2 * H, "out": tokens * cfg.projection_dim,
              "pixels": n * cfg.patch_dim, "pos": n * H, "cos": n * hd, "sin": n * hd}
    offsets, at = {}, 0
    for name, count in floats.items():
        offsets[name] = at
        at += _aligned(count * F32)
    return offsets, at


def weight_bytes(mmproj: MmprojFile) -> int:
    """The device bytes of the tower's weights as CudaVisionEncoder uploads them (the position grid
    stays on the host)."""
    cfg, g = mmproj.config, mmproj.bound.globals

    def matrix(t) -> int:
        rows, cols = t.shape
        return _aligned(t.nbytes if readable(t.qtype, cols) else rows * cols * F32)

    def vector(t) -> int:
        return _aligned(int(np.prod(t.shape)) * F32)

    total = _aligned(cfg.hidden_size * cfg.patch_dim * F32) + matrix(g["mm0_w"]) + matrix(g["mm2_w"])
    total += sum(vector(g[r]) for r in GLOBAL_VECTORS)
    for b in mmproj.bound.blocks:
        total += sum(matrix(b[r]) if r in BLOCK_MATRICES else vector(t) for r, t in b.items())
    return total


def device_bytes(mmproj: MmprojFile, patches: int | None = None) -> tuple[int, int]:
    """(weights, scratch): what the encoder holds on the device with room for `patches` (default:
    the largest image)."""
    n = max_patches(mmproj.config) if patches is None else patches
    return weight_bytes(mmproj), scratch_layout(mmproj.config, n)[1]


class CudaVisionEncoder:
    """The tower of one mmproj file on the current CUDA context. `max_patches`: the scratch for an
    image of that many patches is allocated at once and never grows (a larger image is refused);
    without it the scratch is sized by the largest image so far."""

    def __init__(self, mmproj: MmprojFile, kernels: VisionKernels | None = None, driver=None,
                 max_patches: int | None = None):
        if driver is None:
            import pycuda.driver as driver
        self.cuda, self.cfg = driver, mmproj.config       # driver: pycuda.driver, or a test's stand-in
        self.k = kernels or VisionKernels()
        self.stream = driver.Stream()
        self._mem: list = []
        self.weight_bytes = 0
        self.max_patches, self.capacity, self._scratch = max_patches, 0, None
        g = mmproj.bound.globals
        w = np.stack([g["patch0"].dequant(), g["patch1"].dequant()], axis=2)          # [H, 3, 2, P, P]
        self.patch = self._f32_matrix(w.reshape(self.cfg.hidden_size, -1))
        self.pos = g["pos"].dequant()
        self.vec = {r: self._put(g[r].dequant()) for r in GLOBAL_VECTORS}
        self.mm0, self.mm2 = self._matrix(g["mm0_w"]), self._matrix(g["mm2_w"])
        self.blocks = []
        for b in mmproj.bound.blocks:
            block = {r: self._put(t.dequant()) for r, t in b.items() if r not in BLOCK_MATRICES}
            block.update({r: self._matrix(b[r]) for r in BLOCK_MATRICES})
            self.blocks.append(block)
        if max_patches is not None:
            self._room(max_patches)

    @property
    def nbytes(self) -> int:
        """Device bytes held: the weights and the scratch."""
        return self.weight_bytes + (scratch_layout(self.cfg, self.capacity)[1] if self._scratch else 0)

    def _put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        mem = self.cuda.mem_alloc(_aligned(a.nbytes))
        self.cuda.memcpy_htod(mem, a)
        self._mem.append(mem)
        self.weight_bytes += _aligned(a.nbytes)
        return int(mem)

    def _matrix(self, t) -> DeviceMatrix:
        rows, cols = t.shape
        if not readable(t.qtype, cols):
            return self._f32_matrix(t.dequant())
        return DeviceMatrix(Q(t.qtype), self._put(t.raw), rows, cols, t.row_bytes)

    def _f32_matrix(self, w: np.ndarray) -> DeviceMatrix:
        w = np.ascontiguousarray(w, np.float32)
        return DeviceMatrix(Q.F32, self._put(w), w.shape[0], w.shape[1], 4 * w.shape[1])

    def _room(self, n: int) -> int:
        """The scratch for n patches (its base pointer), allocated or grown as the encoder allows."""
        if n > self.capacity:
            if self._scratch is not None and self.max_patches is not None:
                raise ValueError(f"an image of {n} patches; this encoder was given room for {self.max_patches}")
            if self._scratch is not None:
                self._scratch.free()
                self._scratch = None
            self._scratch = self.cuda.mem_alloc(scratch_layout(self.cfg, n)[1])
            self.capacity = n
        return int(self._scratch)

    def free(self) -> None:
        for mem in self._mem + ([self._scratch] if self._scratch is not None else []):
            mem.free()
        self._mem.clear()
        self._scratch, self.capacity, self.weight_bytes = None, 0, 0

    def _gemm(self, m: DeviceMatrix, x: int, y: int, n: int, bias: int, accumulate=False, act=ACT_NONE):
        self.k.gemm(self.stream, m.qtype, x=x, ldx=m.cols, y=y, ldy=m.rows, w=m.ptr, row_bytes=m.row_bytes,
                    bias=bias, n=n, rows=m.rows, cols=m.cols, accumulate=accumulate, act=act)

    def encode(self, patches: Patches) -> np.ndarray:
        """patches of one image -> its image-token embeddings [n_tokens, text hidden]."""
        cfg, cuda, s = self.cfg, self.cuda, self.stream
        patches.check(cfg)
        n, H, nh, hd = patches.pixels.shape[0], cfg.hidden_size, cfg.n_heads, cfg.head_dim
        tokens, D = n // cfg.merge_size ** 2, cfg.projection_dim
        rows, cols = patch_rows_cols(patches.grid_h, patches.grid_w, cfg.merge_size)
        pos = interpolated_positions(self.pos, cfg.grid_side, rows, cols, patches.grid_h, patches.grid_w)
        cos, sin = rotary_2d(rows, cols, hd, cfg.rope_theta)
        base, offsets = self._room(n), scratch_layout(cfg, n)[0]
        b = {name: base + off for name, off in offsets.items()}
        x, h, qkv, o, u, m, out = (b[k] for k in ("x", "h", "qkv", "o", "u", "m", "out"))
        q, k, v = b["planes"], b["planes"] + n * H * F32, b["planes"] + 2 * n * H * F32
        for name, a in zip(("pixels", "x", "cos", "sin"), (patches.pixels, pos, cos, sin)):
            cuda.memcpy_htod(b[name], np.ascontiguousarray(a, np.float32))      # x = positions
        self._gemm(self.patch, b["pixels"], x, n, self.vec["patch_b"], accumulate=True)
        for w in self.blocks:
            self.k.layer_norm(s, x, h, w["ln1_w"], w["ln1_b"], n, H, cfg.eps)
            self._gemm(w["qkv_w"], h, qkv, n, w["qkv_b"])
            self.k.rotary_split(s, qkv, b["cos"], b["sin"], q, k, v, n, nh, hd)
            self.k.attention(s, q, k, v, o, n, nh, hd)
            self._gemm(w["out_w"], o, x, n, w["out_b"], accumulate=True)
            self.k.layer_norm(s, x, h, w["ln2_w"], w["ln2_b"], n, H, cfg.eps)
            self._gemm(w["up_w"], h, u, n, w["up_b"], act=ACT_GELU_TANH)
            self._gemm(w["down_w"], u, x, n, w["down_b"], accumulate=True)
        self.k.layer_norm(s, x, h, self.vec["post_ln_w"], self.vec["post_ln_b"], n, H, cfg.eps)
        self._gemm(self.mm0, h, m, tokens, self.vec["mm0_b"], act=ACT_GELU_ERF)   # h as [tokens, M]
        self._gemm(self.mm2, m, out, tokens, self.vec["mm2_b"])
        s.synchronize()
        result = np.empty((tokens, D), np.float32)
        cuda.memcpy_dtoh(result, out)
        return result
