"""The CUDA kernels of native/cuda, compiled once with pycuda and launched with typed wrappers.

Arguments are device addresses (ints) and scalars; every launch goes on the stream it is given.
The GEMM kernels form a registry keyed by GGUF type.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

CUDA_DIR = Path(__file__).resolve().parent
SOURCES = ("gemm.cu", "norm.cu", "conv.cu", "deltanet.cu", "attention.cu", "moe.cu")
NVCC_OPTIONS = ["-maxrregcount=63", "-O3"]

GEMM_KERNELS: dict[Q, str] = {
    Q.F32: "gemm_f32", Q.F16: "gemm_f16", Q.BF16: "gemm_bf16", Q.Q8_0: "gemm_q8_0",
    Q.Q4_0: "gemm_q4_0", Q.Q4_K: "gemm_q4_k", Q.Q5_K: "gemm_q5_k", Q.Q6_K: "gemm_q6_k",
    **{q: f"gemm_{q.name.lower()}" for q in (      # quant_linear.cuh and quant_iq.cuh
        Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.TQ1_0, Q.TQ2_0, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4,
        Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M)},
}
ROWS_KERNELS: dict[Q, str] = {q: name.replace("gemm_", "rows_") for q, name in GEMM_KERNELS.items()}
GATE_UP_KERNELS: dict[Q, str] = {q: name.replace("gemm_", "gemm_gate_up_") for q, name in GEMM_KERNELS.items()}
GEMM_BM, GEMM_BN = 64, 128   # rows per tile (a tile list entry), output columns per block
GEMM_BK = 32            # K must be a multiple of this (the 32-element blocks; the kernels step by 8)
GEMM_X_ALIGN = 4        # X rows are read as float4: row stride and base in multiples of 4 floats
GDN_CHUNK, GDN_TILE, GDN_MAX_DK = 64, 32, 128
GDN_SLICE = 16          # dv columns per scan block
ATT_BQ, ATT_THREADS, ATT_MAX_HD = 32, 512, 256   # query rows (token, head of a group) per block
ROUTE_MAX_E = 1024

# kernel -> pycuda prepared-call argument format (P pointer, i int32, q int64, f float32)
SIGNATURES = {
    **{name: "PiPPiiPPqPii" for name in GEMM_KERNELS.values()},
    **{name: "PqPPi" for name in ROWS_KERNELS.values()},
    **{name: "PiPPiPPPqPii" for name in GATE_UP_KERNELS.values()},
    "rms_norm": "PiiPiiPiif", "rms_norm_gated": "PPPPif", "l2_norm": "Piiiff",
    "rope_neox": "PiiiiPi", "conv1d_silu": "PPPPiii", "conv1d_state": "PPiii",
    "gdn_gates": "PPPPii", "gdn_chunk_prep": "PPPiiiiiiiPPPP", "gdn_chunk_scan": "PiiiiiiiPPPPPPi",
    "attn_prefill": "PPPPiiPiiiiif", "moe_route": "PPPii", "moe_count": "PPi",
    "moe_tiles": "PPPii", "moe_scatter": "PPPPii", "silu_mul": "PPPq", "moe_combine": "PPPPPPiii",
}


class KernelError(RuntimeError):
    pass


def _gemm_checked(kernels: dict, qtype: Q, x: int, ldx: int, K: int, n_tiles: int) -> bool:
    """KernelError for what a GEMM kernel cannot take; False when there is nothing to launch."""
    if qtype not in kernels:
        raise KernelError(f"no GEMM kernel for {Q(qtype).name}; have {', '.join(q.name for q in kernels)}")
    if K % GEMM_BK:
        raise KernelError(f"GEMM inner dimension {K} is not a multiple of {GEMM_BK}")
    if ldx % GEMM_X_ALIGN or x % (4 * GEMM_X_ALIGN):
        raise KernelError(f"GEMM X at {x:#x} with row stride {ldx}: need 16-byte rows")
    return n_tiles > 0


def _blocks(n: int, threads: int = 256) -> tuple[int, int, int]:
    return (max(1, -(-n // threads)), 1, 1)


class Kernels:
    """Compiled functions; one wrapper per kernel family."""

    def __init__(self):
        from pycuda.compiler import SourceModule
        self.fn = {}
        for src in SOURCES:
            module = SourceModule((CUDA_DIR / src).read_text(), options=NVCC_OPTIONS,
                                  include_dirs=[str(CUDA_DIR)], no_extern_c=True)
            for name, fmt in SIGNATURES.items():
                try:
                    f = module.get_function(name)
                except Exception:
                    continue
                f.prepare(fmt)
                self.fn[name] = f
        missing = set(SIGNATURES) - set(self.fn)
        if missing:
            raise KernelError(f"kernels missing from {CUDA_DIR}: {', '.join(sorted(missing))}")

    def _go(self, name: str, grid, block, stream, *args) -> None:
        self.fn[name].prepared_async_call(grid, block, stream, *args)

    # ---- GEMM: Y[rows, N] (+)= X[rows, K] . W[N, K]^T over a tile list
    def gemm(self, stream, qtype: Q, *, x: int, ldx: int, y: int, ldy: int, w: int, row_bytes: int,
             tiles: int, n_tiles: int, N: int, K: int, xrows: int = 0, woff: int = 0,
             accumulate: bool = False) -> None:
        """Tiles hold at most GEMM_BM rows each."""
        if not _gemm_checked(GEMM_KERNELS, qtype, x, ldx, K, n_tiles):
            return
        self._go(GEMM_KERNELS[qtype], (-(-N // GEMM_BN), n_tiles, 1), (256, 1, 1), stream,
                 x, ldx, xrows, y, ldy, int(accumulate), w, woff, row_bytes, tiles, N, K)

    def gemm_gate_up(self, stream, qtype: Q, *, x: int, ldx: int, y: int, ldy: int, woff: int, woff_up: int,
                     row_bytes: int, tiles: int, n_tiles: int, N: int, K: int, xrows: int = 0, w: int = 0) -> None:
        """act[rows, N] = silu(X Wg^T) * (X Wu^T) over a tile list, N features: group g's gate rows at
        w + woff[g], its up rows at w + woff_up[g] (both [N, row_bytes] of qtype)."""
        if not woff or not woff_up:
            raise KernelError("the gate/up GEMM reads its weights through the woff and woff_up tables")
        if not _gemm_checked(GATE_UP_KERNELS, qtype, x, ldx, K, n_tiles):
            return
        self._go(GATE_UP_KERNELS[qtype], (-(-N // (GEMM_BN // 2)), n_tiles, 1), (256, 1, 1), stream,
                 x, ldx, xrows, y, ldy, w, woff, woff_up, row_bytes, tiles, N, K)

    def dequant_rows(self, stream, qtype: Q, w: int, row_bytes: int, rows: int, out: int, n: int, K: int):
        """out[r] = row rows[r] (or r when rows is 0) of W as fp32, for n rows."""
        if qtype not in ROWS_KERNELS:
            raise KernelError(f"no row dequantizer for {Q(qtype).name}")
        self._go(ROWS_KERNELS[qtype], (n, 1, 1), (128, 1, 1), stream, w, row_bytes, rows, out, K)

    # ---- norms and rotary
    def rms_norm(self, stream, x, ldx, hsx, y, ldy, hsy, w, rows, per, dim, eps):
        self._go("rms_norm", (rows, 1, 1), (256, 1, 1), stream, x, ldx, hsx, y, ldy, hsy, w, per, dim, eps)

    def rms_norm_gated(self, stream, x, z, y, w, rows, dim, eps):
        self._go("rms_norm_gated", (rows, 1, 1), (256, 1, 1), stream, x, z, y, w, dim, eps)

    def l2_norm(self, stream, x, ldx, rows, per, dim, eps, scale):
        self._go("l2_norm", (rows, 1, 1), (256, 1, 1), stream, x, ldx, per, dim, eps, scale)

    def rope(self, stream, x, ldx, heads, hd, rope_dim, cs, T):
        self._go("rope_neox", _blocks(T * heads * (rope_dim // 2)), (256, 1, 1), stream,
                 x, ldx, heads, hd, rope_dim, cs, T)

    # ---- Gated DeltaNet
    def conv1d(self, stream, x, state, w, out, T, C, K):
        self._go("conv1d_silu", _blocks(T * C), (256, 1, 1), stream, x, state, w, out, T, C, K)
        self._go("conv1d_state", _blocks(C), (256, 1, 1), stream, x, state, T, C, K)

    def gdn_gates(self, stream, alpha, beta, ssm_a, dt_bias, T, nv):
        self._go("gdn_gates", _blocks(T * nv), (256, 1, 1), stream, alpha, beta, ssm_a, dt_bias, T, nv)

    def gdn_chunked(self, stream, qkv, g, beta, shape: tuple, gcum, aqk, u, wk, state, o):
        T, C, nk, nv, dk, dv, tiled = shape
        if dk > GDN_MAX_DK or dk % GDN_TILE or dv % GDN_TILE:
            raise KernelError(f"Gated DeltaNet head dims {dk}/{dv}: need multiples of {GDN_TILE}, dk <= {GDN_MAX_DK}")
        if qkv % 16:
            raise KernelError(f"Gated DeltaNet qkv at {qkv:#x}: the kernels read 16-byte rows")
        nch = -(-T // GDN_CHUNK)
        self._go("gdn_chunk_prep", (nch, nv, 1), (256, 1, 1), stream, qkv, g, beta, *shape, gcum, aqk, u, wk)
        self._go("gdn_chunk_scan", (nv, dv // GDN_SLICE, 1), (256, 1, 1), stream, qkv, *shape,
                 gcum, aqk, u, wk, state, o, nch)

    # ---- attention
    def attention(self, stream, q, kc, vc, gate, ldg, hsg, out, T, pos0, nh, nkv, hd):
        if hd > ATT_MAX_HD or hd % 16:
            raise KernelError(f"attention head dim {hd}: need a multiple of 16, at most {ATT_MAX_HD}")
        if nh % nkv:
            raise KernelError(f"attention with {nh} query heads over {nkv} KV heads: need a whole group each")
        if (q | kc | vc) % 16:
            raise KernelError("attention q, k and v caches are read as float4: need 16-byte addresses")
        self._go("attn_prefill", (-(-T * (nh // nkv) // ATT_BQ), nkv, 1), (ATT_THREADS, 1, 1), stream,
                 q, kc, vc, gate, ldg, hsg, out, T, pos0, nh, nkv, hd, np.float32(1.0 / np.sqrt(hd)))

    # ---- MoE
    def moe_route(self, stream, logits, ids, w, T, E, k):
        if E > ROUTE_MAX_E or k > 32:
            raise KernelError(f"routing supports at most {ROUTE_MAX_E} experts and top-32, got {E}/{k}")
        self._go("moe_route", (T, 1, 1), (256, 1, 1), stream, logits, ids, w, E, k)

    def moe_count(self, stream, ids, counts, n):
        self._go("moe_count", _blocks(n), (256, 1, 1), stream, ids, counts, n)

    def moe_tiles(self, stream, counts, cursor, tiles, E, bm):
        self._go("moe_tiles", (1, 1, 1), (256, 1, 1), stream, counts, cursor, tiles, E, bm)

    def moe_scatter(self, stream, ids, cursor, tok, pos, n, k):
        self._go("moe_scatter", _blocks(n), (256, 1, 1), stream, ids, cursor, tok, pos, n, k)

    def silu_mul(self, stream, gate, up, act, n):
        self._go("silu_mul", _blocks(n), (256, 1, 1), stream, gate, up, act, np.int64(n))

    def moe_combine(self, stream, x, down, pos, w, shared, sg, T, H, k):
        self._go("moe_combine", _blocks(T * H), (256, 1, 1), stream, x, down, pos, w, shared, sg, T, H, k)
