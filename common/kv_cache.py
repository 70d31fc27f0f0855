"""The types a KV cache is kept in (--kv-type), and their conversions from and to float32.

    f32    float32 (pos, n_kv_heads, head_dim)
    f16    float16 (pos, n_kv_heads, head_dim), rounded to nearest even
    q8_0   uint8 (pos, n_kv_heads, head_dim / 32 * 34): ggml's block_q8_0, per 32 values an f16
           scale d = max|x| / 127 and 32 int8 round(x / d), as llama.cpp's -ctk q8_0 keeps it

Every runner stores its K and V rows in the sequence's type and attends over them decoded, so
the numpy conversions here are the reference for the native ones (native/cpu, fm_kv_store).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants

from .errors import UserError
from .model.quants import dequantize

KV_TYPES = ("f16", "q8_0", "f32")
DEFAULT_KV_TYPE = "f16"
KV_CODE = {"f32": 0, "f16": 1, "q8_0": 8}     # ggml type ids: what native code is told
Q8_BLOCK, Q8_BLOCK_BYTES = 32, 34


class KvTypeError(UserError, ValueError):
    """A --kv-type that is not one of KV_TYPES, or that this model's head size cannot use."""


def check_kv_type(kv_type: str, head_dim: int | None = None) -> str:
    """`kv_type`, or KvTypeError; without `head_dim` (no model read yet) only the name is checked."""
    if kv_type not in KV_TYPES:
        raise KvTypeError(f"--kv-type {kv_type!r} is not one of {', '.join(KV_TYPES)}")
    if kv_type == "q8_0" and head_dim is not None and head_dim % Q8_BLOCK:
        raise KvTypeError(f"--kv-type q8_0 needs a head size that is a multiple of {Q8_BLOCK}; "
                          f"this model's is {head_dim}: use f16")
    return kv_type


def check_same_kv_type(got: object, own: str, what: str, here: str) -> None:
    """ValueError unless `what` (a state, a worker) keeps its KV cache in `own`, the type of `here`."""
    if got != own:
        raise ValueError(f"{what} keeps its KV cache in {got!r:.20}, {here} in {own!r} (--kv-type): "
                         f"start the router, prefill and decode with the same --kv-type")


def kv_dtype(kv_type: str) -> np.dtype:
    return np.dtype({"f32": np.float32, "f16": np.float16, "q8_0": np.uint8}[kv_type])


def kv_width(kv_type: str, head_dim: int) -> int:
    """Elements of kv_dtype per head of one position."""
    return head_dim // Q8_BLOCK * Q8_BLOCK_BYTES if kv_type == "q8_0" else head_dim


def kv_shape(pos: int, n_kv_heads: int, head_dim: int, kv_type: str) -> tuple[int, int, int]:
    return (pos, n_kv_heads, kv_width(kv_type, head_dim))


def kv_encode(x: np.ndarray, kv_type: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 (..., head_dim) -> the cache's array (..., kv_width); written into `out` when given."""
    x = np.ascontiguousarray(x, np.float32)
    if kv_type == "q8_0":
        coded = quants.quantize(x, GGMLQuantizationType.Q8_0)
        if out is None:
            return coded
        out[...] = coded
        return out
    if out is None:
        return x if kv_type == "f32" else x.astype(np.float16)
    np.copyto(out, x, casting="same_kind")      # f16 rounds to nearest even, as astype does
    return out


def kv_decode(a: np.ndarray, kv_type: str) -> np.ndarray:
    """The cache's array (..., kv_width) -> float32 (..., head_dim)."""
    if kv_type == "f32":
        return a
    if kv_type == "f16":
        return a.astype(np.float32)
    return dequantize(a, GGMLQuantizationType.Q8_0)


def kv_type_of(a: np.ndarray) -> str:
    """The type of a cache array, from its dtype (what a state frame's array says it is)."""
    for name in KV_TYPES:
        if a.dtype == kv_dtype(name):
            return name
    raise ValueError(f"a KV cache array of dtype {a.dtype} is none of {', '.join(KV_TYPES)}")
