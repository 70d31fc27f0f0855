"""Float32 views of a GGUF model's weights for the reference model.

Dense tensors are dequantized on first use and kept when the model is small; large models
dequantize per call, so a prefill holds one layer's weights at a time. Expert stacks are
always dequantized per call, and only for the experts that were routed to.
"""
from __future__ import annotations

import numpy as np

from ..model.gguf_file import GGUFModel

KEEP_DEQUANTIZED_BELOW = 512 << 20   # file bytes under which dense weights stay dequantized


class Weights:
    def __init__(self, model: GGUFModel):
        self.model = model
        self.keep = model.nbytes < KEEP_DEQUANTIZED_BELOW
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.model

    def get(self, name: str) -> np.ndarray:
        if name in self._cache:
            return self._cache[name]
        value = self.model.tensor(name).dequant()
        if self.keep:
            self._cache[name] = value
        return value

    def rows(self, name: str, index) -> np.ndarray:
        """Selected rows (or experts) along the first axis."""
        return self.model.tensor(name).dequant(np.asarray(index))

    def matmul_rows_blocked(self, name: str, x: np.ndarray, block: int = 16384) -> np.ndarray:
        """x @ W.T for a large (out, in) W, dequantizing `block` rows at a time. x: [T, in]."""
        t = self.model.tensor(name)
        if self.keep:
            return x @ self.get(name).T
        out = np.empty((x.shape[0], t.shape[0]), np.float32)
        for r in range(0, t.shape[0], block):
            out[:, r:r + block] = x @ t.dequant(slice(r, r + block)).T
        return out
