"""A sequence's state between the host and the CUDA prefill's device state (native/cuda/layers.py
StateBlock): up before a prompt (KV decoded to f32), and the state after it, read back layer by
layer."""
from __future__ import annotations

import numpy as np

from common.kv_cache import kv_decode, kv_encode
from common.model.config import ModelConfig
from common.state import SequenceState

from .layers import F32


def upload_state(cuda, dev, state: SequenceState, stream) -> None:
    """`state` into the device state `dev` (an empty state as zeros)."""
    for n, ptr in enumerate(dev.conv):
        if state.pos == 0:                        # an empty state is all zeros
            cuda.memset_d32_async(ptr, 0, state.conv[n].size, stream)
            cuda.memset_d32_async(dev.ssm[n], 0, state.ssm[n].size, stream)
            continue
        cuda.memcpy_htod(ptr, np.ascontiguousarray(state.conv[n], np.float32))
        cuda.memcpy_htod(dev.ssm[n], np.ascontiguousarray(state.ssm[n], np.float32))
    for n in range(len(dev.k)):
        if state.pos:
            for d, host in ((dev.k[n], state.k[n]), (dev.v[n], state.v[n])):
                cuda.memcpy_htod(d, np.ascontiguousarray(kv_decode(host[:state.pos], state.kv_type), np.float32))


class HostState:
    """The state after this call on the host: the recurrent state in f32, and per attention layer
    the new KV rows, read back a pass at a time into f32 scratch and encoded to the cache's type
    there, while later layers compute, instead of all at the end."""

    def __init__(self, cfg: ModelConfig, state: SequenceState, pass_tokens: int):
        self.cfg, self.start, self.kv_type = cfg, state.pos, state.kv_type
        self.conv = [np.empty_like(c, dtype=np.float32) for c in state.conv]
        self.ssm = [np.empty((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32) for _ in state.ssm]
        rows = (pass_tokens, cfg.n_kv_heads, cfg.head_dim)
        self.scratch = [(np.empty(rows, np.float32), np.empty(rows, np.float32)) for _ in state.k]
        self.k: list[list[np.ndarray]] = [[] for _ in state.k]      # encoded rows, pass by pass
        self.v: list[list[np.ndarray]] = [[] for _ in state.v]

    def sink(self, slot: int, dev, layer: int, pos: int, T: int, last: bool) -> list:
        """(host array, device address) pairs of one layer's state to read back after this pass."""
        if self.cfg.is_full_attention(layer):
            row = self.cfg.n_kv_heads * self.cfg.head_dim * F32
            k, v = self.scratch[slot]
            return [(k[:T], dev.k[slot] + pos * row), (v[:T], dev.v[slot] + pos * row)]
        return [(self.conv[slot], dev.conv[slot]), (self.ssm[slot], dev.ssm[slot])] if last else []

    def encode(self, slot: int, T: int) -> None:
        """The pass's KV rows of one attention layer, read back, into the cache's type."""
        for rows, out in zip(self.scratch[slot], (self.k[slot], self.v[slot])):
            coded = kv_encode(rows[:T], self.kv_type)
            out.append(coded.copy() if np.shares_memory(coded, rows) else coded)   # f32: the next pass reuses rows

    def into(self, state: SequenceState, end: int) -> None:
        """Set `state` to this call's result: its KV rows before the call, then the new ones."""
        keep = self.start
        state.k = [np.concatenate([old[:keep], *new]) for old, new in zip(state.k, self.k)]
        state.v = [np.concatenate([old[:keep], *new]) for old, new in zip(state.v, self.v)]
        state.pos, state.conv, state.ssm = end, self.conv, self.ssm
