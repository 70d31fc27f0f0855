"""GGML's weight types in numpy: their value tables and, per type, the reference dequantization.

`QUANTS` is the registry: one `Quant` per GGML type (values per block, bytes per block, the
dequantization of (blocks, block_bytes) uint8 into (blocks, block) float32), gathered from the
family files (floats, blocks32, kquants, codebooks, iquants, ternary). Each dequantization does
its float32 operations in the order gguf's `dequantize` does, so both give the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType

from . import blocks32, codebooks, floats, iquants, kquants, ternary


@dataclass(frozen=True)
class Quant:
    qtype: GGMLQuantizationType
    block: int                   # values per block
    block_bytes: int             # bytes per block
    dequant: Callable[[np.ndarray], np.ndarray]   # (blocks, block_bytes) uint8 -> (blocks, block) float32

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block


QUANTS: dict[GGMLQuantizationType, Quant] = {
    q: Quant(q, *entry) for family in (floats, blocks32, kquants, codebooks, iquants, ternary)
    for q, entry in family.TYPES.items()}
CHUNK_BLOCKS = 1 << 15          # blocks dequantized at once: bounds the temporaries of a large tensor


class UnknownQuantError(ValueError):
    """A GGML type the reference path cannot dequantize."""


def quant(qtype: GGMLQuantizationType | int) -> Quant:
    try:
        return QUANTS[GGMLQuantizationType(qtype)]
    except (KeyError, ValueError):
        name = getattr(qtype, "name", qtype)
        raise UnknownQuantError(f"no dequantization for GGML type {name}; known: "
                                f"{', '.join(sorted(q.name for q in QUANTS))}") from None


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType | int) -> np.ndarray:
    """Stored rows (..., row_bytes) uint8 -> float32 (..., row_bytes // block_bytes * block)."""
    q = quant(qtype)
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.shape[-1] % q.block_bytes:
        raise ValueError(f"rows of {raw.shape[-1]} bytes are not whole {q.qtype.name} blocks of {q.block_bytes}")
    out_shape = (*raw.shape[:-1], raw.shape[-1] // q.block_bytes * q.block)
    blocks = raw.reshape(-1, q.block_bytes)                      # (n_blocks, block_bytes)
    out = np.empty((len(blocks), q.block), np.float32)           # (n_blocks, block)
    with np.errstate(invalid="ignore", over="ignore"):     # a NaN or inf scale stays so, as in GGML
        for start in range(0, len(blocks), CHUNK_BLOCKS):
            out[start:start + CHUNK_BLOCKS] = q.dequant(blocks[start:start + CHUNK_BLOCKS])
    return out.reshape(out_shape)
