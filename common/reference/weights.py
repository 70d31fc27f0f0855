"""Float32 views of a GGUF model's weights for the reference model.

Dense tensors are dequantized on first use and kept when the model is small; large models
dequantize per call, so a prefill holds one layer's weights at a time. Expert stacks are
always dequantized per call, and only for the experts that were routed to. Tensors come bound
by role (common/model/layers.py).
"""
from __future__ import annotations

import numpy as np

from ..model.gguf_file import GGUFModel, Tensor
from ..model.layers import Bound

KEEP_DEQUANTIZED_BELOW = 512 << 20   # file bytes under which dense weights stay dequantized


class Weights:
    def __init__(self, model: GGUFModel):
        self.keep = model.nbytes < KEEP_DEQUANTIZED_BELOW
        self._cache: dict[str, np.ndarray] = {}

    def get(self, t: Tensor) -> np.ndarray:
        if t.name in self._cache:
            return self._cache[t.name]
        value = t.dequant()
        if self.keep:
            self._cache[t.name] = value
        return value

    def rows(self, t: Tensor, index) -> np.ndarray:
        """Selected rows (or experts) along the first axis."""
        return t.dequant(np.asarray(index))

    def matmul_rows_blocked(self, t: Tensor, x: np.ndarray, block: int = 16384) -> np.ndarray:
        """x @ W.T for a large (out, in) W, dequantizing `block` rows at a time. x: [T, in]."""
        if self.keep:
            return x @ self.get(t).T
        out = np.empty((x.shape[0], t.shape[0]), np.float32)
        for r in range(0, t.shape[0], block):
            out[:, r:r + block] = x @ t.dequant(slice(r, r + block)).T
        return out


class LayerWeights:
    """One layer's tensors by role, as float32: `w["qkv"]`."""

    def __init__(self, weights: Weights, tensors: Bound):
        self.weights, self.tensors = weights, tensors

    def __getitem__(self, role: str) -> np.ndarray:
        return self.weights.get(self.tensors[role])

    def has(self, role: str) -> bool:
        """Whether the file has this optional tensor."""
        return self.tensors.get(role) is not None

    def rows(self, role: str, index) -> np.ndarray:
        return self.weights.rows(self.tensors[role], index)
