"""Gated full attention: GQA with q/k RMSNorm, partial NeoX RoPE and a sigmoid output gate.

The K and V caches are in the KV cache type (common.kv_cache): each new row is stored encoded,
and attention reads every row, the new ones too, decoded, as llama.cpp reads its cache."""
from __future__ import annotations

import numpy as np

from ..kv_cache import kv_decode, kv_encode
from ..model.config import ModelConfig
from .ops import rms_norm, rope_mrope, rope_neox, sigmoid, softmax
from .weights import LayerWeights


class GatedAttention:
    def __init__(self, cfg: ModelConfig, w: LayerWeights, kv_type: str = "f32"):
        self.cfg, self.w, self.kv_type = cfg, w, kv_type

    def forward(self, x: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos: int,
                rope_pos: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x: [T, hidden]; caches: kv_shape(pos, n_kv, hd) in kv_type -> ([T, hidden], new k cache,
        new v cache). rope_pos: [3, T] mRoPE positions (T, H, W) for a prompt with images; None:
        each row's position in the sequence."""
        cfg, w = self.cfg, self.w
        T, nh, nkv, hd = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qg = (x @ w["q"].T).reshape(T, nh, 2 * hd)                            # per head: [query | gate]
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
        k = (x @ w["k"].T).reshape(T, nkv, hd)
        v = (x @ w["v"].T).reshape(T, nkv, hd)
        q = rms_norm(q, w["q_norm"], cfg.rms_eps)
        k = rms_norm(k, w["k_norm"], cfg.rms_eps)
        positions = np.arange(pos, pos + T)
        if rope_pos is None:
            q = rope_neox(q, positions, cfg.rope_dim, cfg.rope_theta)
            k = rope_neox(k, positions, cfg.rope_dim, cfg.rope_theta)
        else:
            q = rope_mrope(q, rope_pos, cfg.rope_dim, cfg.rope_theta, cfg.rope_sections)
            k = rope_mrope(k, rope_pos, cfg.rope_dim, cfg.rope_theta, cfg.rope_sections)

        k_cache = np.concatenate([k_cache, kv_encode(k, self.kv_type)], axis=0)   # [S, nkv, kv_width]
        v_cache = np.concatenate([v_cache, kv_encode(v, self.kv_type)], axis=0)
        keys, values = kv_decode(k_cache, self.kv_type), kv_decode(v_cache, self.kv_type)   # [S, nkv, hd]
        S = keys.shape[0]
        group = nh // nkv
        kh = np.repeat(keys, group, axis=1).transpose(1, 2, 0)                 # [nh, hd, S]
        vh = np.repeat(values, group, axis=1).transpose(1, 0, 2)               # [nh, S, hd]
        scores = (q.transpose(1, 0, 2) @ kh) / np.float32(np.sqrt(hd))        # [nh, T, S]
        causal = positions[:, None] >= np.arange(S)[None, :]
        scores = np.where(causal[None], scores, -np.inf)
        o = (softmax(scores) @ vh).transpose(1, 0, 2).reshape(T, nh * hd)
        o = o * sigmoid(gate)
        return o @ w["o"].T, k_cache, v_cache
