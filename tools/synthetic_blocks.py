"""Random-weight tensors for the synthetic GGUF writers (make_synthetic_gguf.py, make_synthetic_mmproj.py):
blocks of each type with valid scales, and the streamed write of a file's tensors."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from common.model.quants import QUANTS

# ---- random blocks: (rows, cols) of `qtype` with roughly the given standard deviation

def _f16_at(at: int) -> Callable:
    def put(b: np.ndarray, d: np.ndarray) -> None:
        b[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return put


def _e8m0(b: np.ndarray, d: np.ndarray) -> None:
    b[:, 0] = np.clip(np.round(np.log2(d)) + 128, 2, 254)     # MXFP4: 2^(e - 128)


def _iq1_m_d(b: np.ndarray, d: np.ndarray) -> None:
    # IQ1_M spreads its f16 over the top nibbles of four scale words
    bits = d.astype(np.float16).view(np.uint16)[:, None] >> np.array([0, 4, 8, 12], np.uint16)
    words = b[:, 48:56].view(np.uint16)
    words[:] = (words & 0x0FFF) | ((bits & 0xF) << 12)


def _no_minus_128(rng, b: np.ndarray) -> None:
    b[:, 2:][b[:, 2:] == 0x80] = 0x81                          # Q8_0: quantizers never write -128


def _ternary_2bit(rng, b: np.ndarray) -> None:
    # TQ2_0: codes 0..2 (-1, 0, 1), four a byte
    codes = rng.integers(0, 3, (len(b), 64, 4), dtype=np.uint8)
    b[:, 0:64] = (codes << np.array([0, 2, 4, 6], np.uint8)).sum(axis=-1, dtype=np.uint8)


def _ternary_base3(rng, b: np.ndarray) -> None:
    # TQ1_0: 5 digits a byte as ceil(n * 256 / 243), n < 243; the last 4 bytes hold 4, n = 3 * m, m < 81
    n = np.concatenate([rng.integers(0, 243, (len(b), 48)), 3 * rng.integers(0, 81, (len(b), 4))], axis=-1)
    b[:, 0:52] = (n * 256 + 242) // 243


@dataclass(frozen=True)
class Blocks:
    """Random blocks of one type: random bytes (`codes` redraws those a quantizer never writes),
    then the scale d = std / spread * uniform(0.5, 1.5) per block, and where the type has one a
    second field of about d * offset, a minimum that centres the values on 0."""
    qtype: T
    spread: float                              # std of the values at d = 1
    scale: Callable                            # scale(blocks, d (n,)) writes d
    second: Callable | None = None             # writes the minimum (or offset) field
    offset: float = 0.0
    codes: Callable | None = None

    def __call__(self, rng, rows: int, cols: int, std: float) -> np.ndarray:
        block, nbytes = QUANTS[self.qtype].block, QUANTS[self.qtype].block_bytes
        n = rows * cols // block
        b = np.frombuffer(rng.bytes(n * nbytes), np.uint8).copy().reshape(n, nbytes)
        if self.codes:
            self.codes(rng, b)
        self.scale(b, std / self.spread * rng.uniform(0.5, 1.5, n))
        if self.second:
            self.second(b, std / self.spread * self.offset * rng.uniform(0.5, 1.5, n))
        return b


def _float(dtype):
    def make(rng, rows, cols, std):
        x = rng.standard_normal((rows, cols), np.float32) * std
        if dtype == "bf16":     # the top half of each float32
            return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return x.astype(dtype).view(np.uint8)
    return make


def _blocks(qtype: T, spread: float, scale_at, second_at: int | None = None, offset: float = 0.0, codes=None):
    scale = _f16_at(scale_at) if isinstance(scale_at, int) else scale_at
    return Blocks(qtype, spread, scale, None if second_at is None else _f16_at(second_at), offset, codes)


# spread: the values' std at d = 1 (uniform random codes and sub-scales), measured with the
# reference dequantization; offset: E[code] (x E[sub-scale]), negative where the format adds it
BLOCKS = [
    _blocks(T.Q4_0, 4.6, 0), _blocks(T.Q8_0, 73.0, 0, codes=_no_minus_128),
    _blocks(T.Q4_1, 5.7, 0, 2, -7.5), _blocks(T.Q5_0, 9.6, 0), _blocks(T.Q5_1, 11.5, 0, 2, -15.5),
    _blocks(T.Q2_K, 15.2, 80, 82, 1.5), _blocks(T.Q3_K, 45.5, 108),
    _blocks(T.Q4_K, 290.0, 0, 2, 7.5), _blocks(T.Q5_K, 590.0, 0, 2, 15.5), _blocks(T.Q6_K, 1365.0, 208),
    _blocks(T.IQ4_NL, 70.0, 0), _blocks(T.IQ4_XS, 1300.0, 0), _blocks(T.MXFP4, 6.1, _e8m0),
    _blocks(T.IQ2_XXS, 56.0, 0), _blocks(T.IQ2_XS, 58.0, 0), _blocks(T.IQ2_S, 59.0, 0),
    _blocks(T.IQ3_XXS, 147.0, 0), _blocks(T.IQ3_S, 149.0, 0), _blocks(T.IQ1_S, 7.4, 0),
    _blocks(T.IQ1_M, 7.5, _iq1_m_d),
    _blocks(T.TQ1_0, 0.85, 52, codes=_ternary_base3), _blocks(T.TQ2_0, 0.85, 64, codes=_ternary_2bit),
]
MAKERS: dict[T, Callable] = {
    **{b.qtype: b for b in BLOCKS},
    T.F32: _float(np.float32), T.F16: _float(np.float16), T.BF16: _float("bf16"),
}


def write_tensors(writer: GGUFWriter, path: Path, tensors, qtype_of: Callable, values: Callable) -> None:
    """The tensor infos, then each tensor's bytes, values(name, shape, kind, qtype), in turn:
    a file of many GB is never whole in memory."""
    plan = []
    for name, shape, kind in tensors:
        qtype = qtype_of(name, shape, kind)
        block, nbytes = QUANTS[qtype].block, QUANTS[qtype].block_bytes
        byte_shape = (*shape[:-1], shape[-1] // block * nbytes)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        plan.append((name, shape, kind, qtype, byte_shape))
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind, qtype, byte_shape in plan:
        writer.write_tensor_data(np.ascontiguousarray(values(name, shape, kind, qtype)).reshape(byte_shape))
    writer.close()
