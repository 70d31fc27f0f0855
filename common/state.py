"""The state of one sequence: what prefill hands to decode, and what a snapshot stores.

Per linear-attention layer: the conv tail and the Gated DeltaNet matrix.
Per full-attention layer: the K and V caches up to `pos`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .model.config import ModelConfig


@dataclass
class SequenceState:
    pos: int                                  # tokens consumed so far
    conv: list[np.ndarray]                    # per linear layer: (conv_channels, conv_kernel - 1) f32
    ssm: list[np.ndarray]                     # per linear layer: (n_v_heads, head_k_dim, head_v_dim) f32
    k: list[np.ndarray] = field(default_factory=list)   # per full layer: (pos, n_kv_heads, head_dim) f32
    v: list[np.ndarray] = field(default_factory=list)   # per full layer: (pos, n_kv_heads, head_dim) f32

    @classmethod
    def empty(cls, cfg: ModelConfig) -> "SequenceState":
        n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
        return cls(
            pos=0,
            conv=[np.zeros((cfg.conv_channels, cfg.conv_kernel - 1), np.float32) for _ in range(n_lin)],
            ssm=[np.zeros((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32) for _ in range(n_lin)],
            k=[np.zeros((0, cfg.n_kv_heads, cfg.head_dim), np.float32) for _ in range(n_full)],
            v=[np.zeros((0, cfg.n_kv_heads, cfg.head_dim), np.float32) for _ in range(n_full)],
        )

    def copy(self) -> "SequenceState":
        return SequenceState(self.pos, [a.copy() for a in self.conv], [a.copy() for a in self.ssm],
                             [a.copy() for a in self.k], [a.copy() for a in self.v])

    def arrays(self) -> list[np.ndarray]:
        """All arrays in a fixed order: conv..., ssm..., k..., v... (the wire and disk order)."""
        return [*self.conv, *self.ssm, *self.k, *self.v]

    @classmethod
    def from_arrays(cls, pos: int, arrays: list[np.ndarray], cfg: ModelConfig) -> "SequenceState":
        n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
        if len(arrays) != 2 * n_lin + 2 * n_full:
            raise ValueError(f"state needs {2 * n_lin + 2 * n_full} arrays, got {len(arrays)}")
        a = list(arrays)
        return cls(pos, a[:n_lin], a[n_lin:2 * n_lin], a[2 * n_lin:2 * n_lin + n_full],
                   a[2 * n_lin + n_full:])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())
