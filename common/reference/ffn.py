"""A layer's FFN by the config's `ffn_kind`: the MoE (moe.py) or the dense SwiGLU of qwen35."""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from .moe import MoE
from .ops import silu
from .weights import LayerWeights


class DenseFFN:
    """down(silu(gate x) * up x), the same for every token."""

    def __init__(self, cfg: ModelConfig, w: LayerWeights):
        self.w = w

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: [T, hidden] -> [T, hidden]."""
        w = self.w
        return (silu(x @ w["ffn_gate"].T) * (x @ w["ffn_up"].T)) @ w["ffn_down"].T


FFNS = {"moe": MoE, "dense": DenseFFN}


def make_ffn(cfg: ModelConfig, w: LayerWeights):
    return FFNS[cfg.ffn_kind](cfg, w)
