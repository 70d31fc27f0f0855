"""The MTP block (llama.cpp's `nextn`) of Qwen3.5/3.6: the draft step of speculative decoding.

A row is (token t at trunk position i+1, h_i = the trunk's hidden at position i after output_norm):
    u = eh_proj @ [rmsnorm(emb(t)) * enorm ; rmsnorm(h_i) * hnorm]      # embedding first
    x = u + attn(rmsnorm(u) * attn_norm)       # gated full attention over the block's own KV
    x = x + ffn(rmsnorm(x) * post_norm)        # the trunk's FFN kind: the MoE, or the dense SwiGLU
    h_out = rmsnorm(x) * shared_head_norm      # (output_norm when the file has none)
    logits = head @ h_out                      # over the draft vocabulary, if one is set
h_out is the hidden of the next chained draft. The block's KV rows are local to a decode: row 0
is its first position, and RoPE, being relative, scores local positions as absolute ones.
"""
from __future__ import annotations

import numpy as np

from ..kv_cache import kv_dtype, kv_shape
from ..model.config import ModelConfig
from ..model.layers import Bound
from ..state import DraftState
from .attention import GatedAttention
from .ffn import make_ffn
from .ops import rms_norm
from .weights import LayerWeights, Weights


def _either(own, trunk):
    return own if own is not None else trunk


class MtpBlock:
    def __init__(self, cfg: ModelConfig, weights: Weights, tensors: Bound, globals_: Bound,
                 kv_type: str = "f32"):
        self.cfg, self.weights, self.kv_type = cfg, weights, kv_type
        self.w = LayerWeights(weights, tensors)
        self.attention = GatedAttention(cfg, self.w, kv_type)
        self.ffn = make_ffn(cfg, self.w)
        # the optional nextn tensors fall back to the trunk's, as llama.cpp's graph_mtp does
        self.embd = _either(tensors["embed_tokens"], globals_["embd"])
        self.head = _either(tensors["shared_head_head"], globals_["head"])
        self.head_norm = _either(tensors["shared_head_norm"], globals_["out_norm"])
        self.vocab_ids: np.ndarray | None = None
        self._head_rows: np.ndarray | None = None        # [V', hidden] float32 when vocab_ids is set

    def new_state(self) -> DraftState:
        shape = kv_shape(0, self.cfg.n_kv_heads, self.cfg.head_dim, self.kv_type)
        return DraftState(0, np.zeros(shape, kv_dtype(self.kv_type)), np.zeros(shape, kv_dtype(self.kv_type)))

    def state_bytes(self, positions: int) -> int:
        shape = kv_shape(positions, self.cfg.n_kv_heads, self.cfg.head_dim, self.kv_type)
        return 2 * int(np.prod(shape)) * kv_dtype(self.kv_type).itemsize

    def set_vocab(self, ids: np.ndarray | None) -> None:
        if ids is None:
            self.vocab_ids = self._head_rows = None
            return
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError("the draft vocabulary is a non-empty 1-D array of token ids")
        if ids.min() < 0 or ids.max() >= self.cfg.vocab_size or np.any(np.diff(ids) <= 0):
            raise ValueError(f"draft vocabulary ids must be sorted, distinct and in [0, {self.cfg.vocab_size})")
        self.vocab_ids = ids.astype(np.int64)
        self._head_rows = self.weights.rows(self.head, self.vocab_ids)

    def forward(self, tokens: np.ndarray, hidden: np.ndarray, state: DraftState) -> np.ndarray:
        """One sequence's rows in order. tokens: [T]; hidden: [T, H] -> h_out [T, H]; writes the
        block's KV rows at state.pos.. and advances state.pos by T."""
        cfg, w = self.cfg, self.w
        e = rms_norm(self.weights.rows(self.embd, tokens), w["enorm"], cfg.rms_eps)
        h = rms_norm(hidden, w["hnorm"], cfg.rms_eps)
        u = np.concatenate([e, h], axis=1) @ w["eh_proj"].T                  # [T, H]
        k, v = state.k[:state.pos], state.v[:state.pos]
        a, state.k, state.v = self.attention.forward(rms_norm(u, w["attn_norm"], cfg.rms_eps), k, v, state.pos)
        x = u + a
        x = x + self.ffn.forward(rms_norm(x, w["post_norm"], cfg.rms_eps))
        state.pos += len(tokens)
        return rms_norm(x, self.weights.get(self.head_norm), cfg.rms_eps)

    def logits(self, h_out: np.ndarray) -> np.ndarray:
        """[T, H] -> [T, V'] float32: the whole vocabulary, or the draft vocabulary's columns."""
        if self._head_rows is not None:
            return (h_out @ self._head_rows.T).astype(np.float32)
        return self.weights.matmul_rows_blocked(self.head, h_out).astype(np.float32)
