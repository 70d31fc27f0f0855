"""Random-weight tensors for the synthetic GGUF writers (make_synthetic_gguf.py, make_synthetic_mmproj.py):
blocks of each type with valid scales, and the streamed write of a file's tensors."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

# ---- random blocks: (rows, cols) of `qtype` with roughly the given standard deviation

def _f16_field(rng, n: int, scale: float) -> np.ndarray:
    return (scale * rng.uniform(0.5, 1.5, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def _bytes(rng, rows: int, cols: int, qtype: T) -> np.ndarray:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    return np.frombuffer(rng.bytes(rows * cols // block * nbytes), np.uint8).copy().reshape(-1, nbytes)


def _q4_0(rng, rows, cols, std):
    b = _bytes(rng, rows, cols, T.Q4_0)
    b[:, 0:2] = _f16_field(rng, len(b), std / 4.6)          # nibbles - 8: std 4.6
    return b


def _q8_0(rng, rows, cols, std):
    b = _bytes(rng, rows, cols, T.Q8_0)
    b[:, 2:][b[:, 2:] == 0x80] = 0x81                      # quantizers never write -128
    b[:, 0:2] = _f16_field(rng, len(b), std / 73.0)
    return b


def _kquant(spread: float, mean_q: float, qtype: T):
    def make(rng, rows, cols, std):
        b = _bytes(rng, rows, cols, qtype)
        d = std / spread
        b[:, 0:2] = _f16_field(rng, len(b), d)
        b[:, 2:4] = _f16_field(rng, len(b), d * mean_q)   # mins cancel the mean of scale * q
        return b
    return make


def _q6_k(rng, rows, cols, std):
    b = _bytes(rng, rows, cols, T.Q6_K)
    b[:, 208:210] = _f16_field(rng, len(b), std / 1365.0)  # int8 scale * (q - 32): std 1365
    return b


def set_block_scales(qtype: T, blocks: np.ndarray, d: np.ndarray) -> None:
    """Sets the f16 super-block scale of each of blocks (nb, bytes) of a 3- or 1-bit i-quant to d
    (nb, 2) uint8: its first two bytes, or IQ1_M's, spread over the top nibbles of its 4 scale words."""
    if qtype != T.IQ1_M:
        blocks[:, 0:2] = d
        return
    words = blocks[:, 48:56].copy().view(np.uint16)
    bits = d.copy().view(np.uint16)[:, 0]
    for k in range(4):
        words[:, k] = (words[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
    blocks[:, 48:56] = words.view(np.uint8)


def _iq_lowbit(spread: float, qtype: T):
    def make(rng, rows, cols, std):   # random grid indices, signs, deltas and sub-block scales
        b = _bytes(rng, rows, cols, qtype)
        set_block_scales(qtype, b, _f16_field(rng, len(b), std / spread))
        return b
    return make


def _float(dtype):
    def make(rng, rows, cols, std):
        return (rng.standard_normal((rows, cols), np.float32) * std).astype(dtype).view(np.uint8)
    return make


MAKERS: dict[T, Callable] = {
    T.Q4_0: _q4_0, T.Q8_0: _q8_0, T.Q4_K: _kquant(290.0, 7.5, T.Q4_K), T.Q5_K: _kquant(590.0, 15.5, T.Q5_K),
    T.Q6_K: _q6_k, T.F32: _float(np.float32), T.F16: _float(np.float16),
    T.IQ3_XXS: _iq_lowbit(142.0, T.IQ3_XXS), T.IQ3_S: _iq_lowbit(141.0, T.IQ3_S),   # std of values at d 1
    T.IQ1_S: _iq_lowbit(7.2, T.IQ1_S), T.IQ1_M: _iq_lowbit(7.2, T.IQ1_M),
}


def write_tensors(writer: GGUFWriter, path: Path, tensors, qtype_of: Callable, values: Callable) -> None:
    """The tensor infos, then each tensor's bytes, values(name, shape, kind, qtype), in turn:
    a file of many GB is never whole in memory."""
    plan = []
    for name, shape, kind in tensors:
        qtype = qtype_of(name, shape, kind)
        block, nbytes = GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * nbytes)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        plan.append((name, shape, kind, qtype, byte_shape))
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind, qtype, byte_shape in plan:
        writer.write_tensor_data(np.ascontiguousarray(values(name, shape, kind, qtype)).reshape(byte_shape))
    writer.close()
