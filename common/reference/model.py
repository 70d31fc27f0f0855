"""The numpy float32 reference model: the yardstick every fast path is held against.

Its KV cache is in `kv_type` (common.kv_cache), converted by the numpy reference conversions,
so that it defines what a native engine with that cache computes.

It is plain on purpose: one layer object per block, the chunked Gated DeltaNet for prefill and
the recurrent form for decode, weights dequantized from the GGUF blocks as they are needed.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..kv_cache import check_kv_type, check_same_kv_type
from ..model.gguf_file import GGUFModel
from ..model.layers import bind
from ..state import SequenceState
from .attention import GatedAttention
from .deltanet import PREFILL_CHUNK, GatedDeltaNet
from .moe import MoE
from .ops import rms_norm
from .weights import LayerWeights, Weights


class ReferenceModel:
    def __init__(self, model: GGUFModel, kv_type: str = "f32"):
        self.model = model
        self.cfg = cfg = model.config
        self.kv_type = check_kv_type(kv_type, cfg.head_dim)
        self.w = Weights(model)
        bound = bind(model)
        self.globals = bound.globals
        self.layers = [LayerWeights(self.w, tensors) for tensors in bound.layers]
        self.mixers = [GatedAttention(cfg, w, kv_type) if cfg.is_full_attention(i) else GatedDeltaNet(cfg, w)
                       for i, w in enumerate(self.layers)]
        self.moes = [MoE(cfg, w) for w in self.layers]
        # layer -> its index among the linear or the full-attention layers (the state's order)
        self.slot = {i: n for n, i in enumerate(cfg.linear_layers)} | {i: n for n, i in enumerate(cfg.full_layers)}

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.cfg, self.kv_type)

    def prefill(self, tokens: Sequence[int], state: SequenceState, *, chunk: int = PREFILL_CHUNK,
                all_logits: bool = False) -> np.ndarray:
        """Chunked form over the prompt. Returns logits [vocab] of the last token, or [T, vocab]."""
        logits = self.forward(tokens, state, recurrent=False, chunk=chunk, all_logits=all_logits)
        return logits if all_logits else logits[-1]

    def decode(self, tokens: Sequence[int], states: list[SequenceState]) -> np.ndarray:
        """One token per sequence, recurrent form. Returns logits [B, vocab]."""
        return np.stack([self.forward([t], s, recurrent=True)[-1] for t, s in zip(tokens, states)])

    def forward(self, tokens: Sequence[int], state: SequenceState, *, recurrent: bool,
                chunk: int = PREFILL_CHUNK, all_logits: bool = True) -> np.ndarray:
        cfg = self.cfg
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("forward needs a non-empty 1-D token sequence")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        check_same_kv_type(state.kv_type, self.kv_type, "the state", "this runner")
        x = self.w.rows(self.globals["embd"], ids)                            # [T, hidden]
        for i in range(cfg.n_layers):
            w, n = self.layers[i], self.slot[i]
            h = rms_norm(x, w["attn_norm"], cfg.rms_eps)
            if cfg.is_full_attention(i):
                h, state.k[n], state.v[n] = self.mixers[i].forward(h, state.k[n], state.v[n], state.pos)
            else:
                h, state.conv[n], state.ssm[n] = self.mixers[i].forward(
                    h, state.conv[n], state.ssm[n], recurrent, chunk)
            x = x + h
            h = rms_norm(x, w["post_norm"], cfg.rms_eps)
            x = x + self.moes[i].forward(h)
        state.pos += len(ids)
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, self.w.get(self.globals["out_norm"]), cfg.rms_eps)
        return self.w.matmul_rows_blocked(self.globals["head"], x)
