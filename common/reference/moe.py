"""Sparse MoE block: softmax over all experts, top-k, renormalise; plus a sigmoid-gated shared expert."""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from .ops import sigmoid, silu, softmax
from .weights import Weights


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits: [T, E] -> (expert ids [T, k], weights [T, k]), highest first."""
    probs = softmax(logits.astype(np.float32), axis=-1)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    top = np.take_along_axis(probs, ids, axis=-1)
    return ids, top / top.sum(axis=-1, keepdims=True)


class MoE:
    def __init__(self, cfg: ModelConfig, w: Weights, layer: int):
        self.cfg, self.w, self.p = cfg, w, f"blk.{layer}."

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: [T, hidden] -> [T, hidden]."""
        w, p = self.w, self.p
        ids, weights = route(x @ w.get(p + "ffn_gate_inp.weight").T, self.cfg.n_experts_used)
        out = np.zeros_like(x)
        for e in np.unique(ids):
            tokens, slot = np.nonzero(ids == e)
            xe = x[tokens]
            gate = xe @ w.rows(p + "ffn_gate_exps.weight", [e])[0].T          # [n, F]
            up = xe @ w.rows(p + "ffn_up_exps.weight", [e])[0].T
            down = (silu(gate) * up) @ w.rows(p + "ffn_down_exps.weight", [e])[0].T
            out[tokens] += down * weights[tokens, slot][:, None]
        if p + "ffn_up_shexp.weight" in w:
            h = silu(x @ w.get(p + "ffn_gate_shexp.weight").T) * (x @ w.get(p + "ffn_up_shexp.weight").T)
            shared = h @ w.get(p + "ffn_down_shexp.weight").T
            if p + "ffn_gate_inp_shexp.weight" in w:
                gate_w = w.get(p + "ffn_gate_inp_shexp.weight").reshape(-1)
                shared = shared * sigmoid(x @ gate_w)[:, None]
            out += shared
        return out
