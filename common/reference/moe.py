"""Sparse MoE block: softmax over all experts, top-k, renormalise; plus a sigmoid-gated shared expert."""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from .ops import sigmoid, silu, softmax
from .weights import LayerWeights


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits: [T, E] -> (expert ids [T, k], weights [T, k]), highest first."""
    probs = softmax(logits.astype(np.float32), axis=-1)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    top = np.take_along_axis(probs, ids, axis=-1)
    return ids, top / top.sum(axis=-1, keepdims=True)


class MoE:
    def __init__(self, cfg: ModelConfig, w: LayerWeights):
        self.cfg, self.w = cfg, w

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: [T, hidden] -> [T, hidden]."""
        w = self.w
        ids, weights = route(x @ w["router"].T, self.cfg.n_experts_used)
        out = np.zeros_like(x)
        for e in np.unique(ids):
            tokens, slot = np.nonzero(ids == e)
            xe = x[tokens]
            gate = xe @ w.rows("gate_exps", [e])[0].T                         # [n, F]
            up = xe @ w.rows("up_exps", [e])[0].T
            down = (silu(gate) * up) @ w.rows("down_exps", [e])[0].T
            out[tokens] += down * weights[tokens, slot][:, None]
        if self.cfg.has_shared_expert:
            h = silu(x @ w["sh_gate"].T) * (x @ w["sh_up"].T)
            shared = h @ w["sh_down"].T
            if w.has("sh_gate_inp"):
                gate_w = w["sh_gate_inp"].reshape(-1)
                shared = shared * sigmoid(x @ gate_w)[:, None]
            out += shared
        return out
