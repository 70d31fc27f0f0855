"""Output types: which GGML type each tensor gets for a `--type`, and the quantizers.

Rules shared by every type, as llama.cpp's converter applies them:
- 1-D tensors, norms and anything not named `*.weight` (ssm_a, ssm_dt.bias) stay F32;
- the MoE router (`ffn_gate_inp`, `ffn_gate_inp_shexp`) and `ssm_conv1d` stay F32.

A row length that the chosen block type cannot hold falls back to a type that can (see
`_fit_row`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize as gguf_quantize

from .errors import ConvertError
from .kquants import quantize_k

ALWAYS_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")

# q4_k_m keeps the small Gated DeltaNet gate projections exact, like the router: they are
# a sliver of the bytes and feed exp/softplus, where error is amplified.
Q4_K_M_F32 = ("ssm_alpha.weight", "ssm_beta.weight", "ssm_ba.weight")

_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorSlot:
    name: str                   # GGUF name
    shape: tuple[int, ...]      # numpy order
    n_layers: int


def _use_more_bits(layer: int, n_layers: int) -> bool:
    # llama.cpp's choice of layers that get a bigger type in the *_M mixes:
    # the first and last eighth, and every third layer in between.
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def _q4_k_m(slot: TensorSlot) -> Q:
    # llama.cpp's Q4_K_M: Q6_K for output.weight, and for attn_v / ffn_down (the expert and
    # shared stacks alike) in the use_more_bits layers; Q5_K for the fused attn_qkv;
    # Q4_K for the rest. Its special cases for exactly 8 experts (Mixtral) are left out.
    name = slot.name
    if name.endswith(Q4_K_M_F32):
        return Q.F32
    if name == "output.weight":
        return Q.Q6_K
    m = _LAYER.match(name)
    layer = int(m.group(1)) if m else -1
    if ".attn_v." in name or ".ffn_down" in name:
        return Q.Q6_K if _use_more_bits(layer, slot.n_layers) else Q.Q4_K
    if ".attn_qkv." in name:
        return Q.Q5_K
    return Q.Q4_K


def _q4_0(slot: TensorSlot) -> Q:
    # llama-quantize gives output.weight Q6_K in a Q4_0 file; files people have look so.
    return Q.Q6_K if slot.name == "output.weight" else Q.Q4_0


@dataclass(frozen=True)
class FileType:
    name: str
    ftype: LlamaFileType
    pick: Callable[[TensorSlot], Q]


FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in (
    FileType("f32", LlamaFileType.ALL_F32, lambda s: Q.F32),
    FileType("f16", LlamaFileType.MOSTLY_F16, lambda s: Q.F16),
    FileType("bf16", LlamaFileType.MOSTLY_BF16, lambda s: Q.BF16),
    FileType("q8_0", LlamaFileType.MOSTLY_Q8_0, lambda s: Q.Q8_0),
    FileType("q4_0", LlamaFileType.MOSTLY_Q4_0, _q4_0),
    FileType("q4_k_m", LlamaFileType.MOSTLY_Q4_K_M, _q4_k_m),
)}


def file_type(name: str) -> FileType:
    try:
        return FILE_TYPES[name]
    except KeyError:
        raise ConvertError("--type", f"unsupported value {name!r}; choose one of "
                                     f"{', '.join(FILE_TYPES)}") \
            from None


def _fit_row(qtype: Q, row: int) -> Q:
    # A K-quant row that is not a multiple of 256 becomes Q8_0 (llama.cpp picks Q5_0/Q5_1/
    # Q8_0; Q8_0 is the one of these that every Fermium path reads). A row that is not a
    # multiple of 32 either becomes F16, as in llama.cpp's converter.
    block = GGML_QUANT_SIZES[qtype][0]
    if row % block == 0:
        return qtype
    if row % 32 == 0:
        return Q.Q8_0
    return Q.F16


def choose_type(slot: TensorSlot, ft: FileType) -> Q:
    name = slot.name
    if len(slot.shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") \
            or name.endswith(ALWAYS_F32):
        return Q.F32
    return _fit_row(ft.pick(slot), slot.shape[-1])


_K_QUANTS = {Q.Q4_K: "Q4_K", Q.Q5_K: "Q5_K", Q.Q6_K: "Q6_K"}


def quantize(data: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [..., n] -> stored form: float32/float16 values or uint8 [..., row_bytes]."""
    if qtype in _K_QUANTS:
        return quantize_k(data, _K_QUANTS[qtype])
    return gguf_quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)


def stored_nbytes(shape: tuple[int, ...], qtype: Q) -> int:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block) * nbytes
