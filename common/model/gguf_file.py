"""A memory-mapped GGUF model file: metadata, config and tensors in their stored blocks.

Nothing here copies the weights wholesale: `Tensor.raw` is a view into the mapping, and
`Tensor.dequant()` materialises one tensor (or a slice of experts) as float32 on demand.

Shapes are numpy order, the reverse of ggml's `ne`: a linear weight is (out, in), an
expert stack is (n_experts, out, in).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from .config import ModelConfig, ModelConfigError
from .gguf_reader import FastGGUF, GGUFFormatError
from .quants import QUANTS, dequantize

FINGERPRINT_SAMPLE = 4096     # bytes read from each of three places in every tensor
# Types the reference path can dequantize (common/model/quants); the native kernels cover a subset.
SUPPORTED_TYPES = frozenset(QUANTS)


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]       # numpy order, e.g. (out, in)
    raw: np.ndarray              # uint8 view of the stored blocks: (*shape[:-1], row_bytes)

    @property
    def row_bytes(self) -> int:
        q = QUANTS[self.qtype]
        return self.shape[-1] // q.block * q.block_bytes

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) * self.row_bytes

    def dequant(self, index: int | slice | np.ndarray | None = None) -> np.ndarray:
        """float32 values; `index` selects along the first axis (e.g. a few experts)."""
        raw = self.raw if index is None else self.raw[index]
        if self.qtype == GGMLQuantizationType.F32:
            return np.ascontiguousarray(raw).view(np.float32).reshape(*raw.shape[:-1], -1)
        return dequantize(raw, self.qtype)


class GGUFModel:
    """One model file, opened read-only and memory-mapped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        try:
            self.file = FastGGUF(self.path)
        except GGUFFormatError as exc:
            raise ModelConfigError(f"not a readable GGUF file: {exc}") from exc
        self.fields = self.file.fields
        self.tensors: dict[str, Tensor] = {}
        for entry in self.file.entries:
            try:
                qtype = GGMLQuantizationType(entry.ggml_type)
            except ValueError:
                qtype = None
            if qtype not in SUPPORTED_TYPES:
                raise ModelConfigError(
                    f"{self.path}: tensor {entry.name} has type "
                    f"{qtype.name if qtype else entry.ggml_type}; supported: "
                    f"{', '.join(sorted(q.name for q in SUPPORTED_TYPES))}")
            shape = tuple(reversed(entry.ne))
            block, block_bytes = QUANTS[qtype].block, QUANTS[qtype].block_bytes
            if shape[-1] % block:
                raise ModelConfigError(f"{self.path}: tensor {entry.name} rows of {shape[-1]} are not "
                                       f"whole {qtype.name} blocks of {block}")
            rows = int(np.prod(shape[:-1], dtype=np.int64))
            row_bytes = shape[-1] // block * block_bytes
            try:
                raw = self.file.tensor_bytes(entry, rows * row_bytes).reshape(*shape[:-1], row_bytes)
            except GGUFFormatError as exc:
                raise ModelConfigError(str(exc)) from exc
            self.tensors[entry.name] = Tensor(entry.name, qtype, shape, raw)

    # ---- metadata
    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str):
        return self.fields[key]

    def keys(self) -> list[str]:
        return list(self.fields)

    @cached_property
    def config(self) -> ModelConfig:
        vocab = self.tensors["token_embd.weight"].shape[0] if "token_embd.weight" in self.tensors \
            else len(self.get("tokenizer.ggml.tokens"))
        return ModelConfig.from_gguf_fields(self.get, self.has, self.path, vocab)

    # ---- tensors
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelConfigError(f"{self.path}: missing tensor {name!r}") from None

    def blk(self, layer: int, name: str) -> Tensor:
        return self.tensor(f"blk.{layer}.{name}.weight")

    def f32(self, name: str) -> np.ndarray:
        return self.tensor(name).dequant()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @cached_property
    def fingerprint(self) -> str:
        """Names this model's weights: the tensor table and FINGERPRINT_SAMPLE bytes from the start,
        middle and end of each tensor, so two files of the same shapes with other weights differ."""
        h = hashlib.blake2b(digest_size=8)
        for name in sorted(self.tensors):
            t = self.tensors[name]
            raw = t.raw.reshape(-1)
            h.update(f"{name}:{t.qtype.name}:{t.shape};".encode())
            for start in (0, max(0, raw.size // 2 - FINGERPRINT_SAMPLE // 2), max(0, raw.size - FINGERPRINT_SAMPLE)):
                h.update(raw[start:start + FINGERPRINT_SAMPLE].tobytes())
        return h.hexdigest()
