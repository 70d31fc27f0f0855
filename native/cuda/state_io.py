"""A sequence's state between the host and the CUDA prefill's device state (native/cuda/layers.py
StateBlock): up before a prompt (KV decoded to f32), and the state after it, read back layer by
layer."""
from __future__ import annotations

import numpy as np

from common.kv_cache import kv_decode, kv_dtype, kv_encode, kv_shape
from common.model.config import ModelConfig
from common.state import SequenceState

from .layers import F32, StateBlock


def alloc_state(cfg: ModelConfig, arena, max_context: int) -> StateBlock:
    """The device state: per linear layer its conv and recurrent state, per full layer its KV."""
    conv = cfg.conv_channels * (cfg.conv_kernel - 1) * F32
    ssm = cfg.n_v_heads * cfg.head_k_dim * cfg.head_v_dim * F32
    kv = max_context * cfg.n_kv_heads * cfg.head_dim * F32
    lin, full = range(len(cfg.linear_layers)), range(len(cfg.full_layers))
    return StateBlock(conv=[arena.alloc(f"conv {n}", conv) for n in lin],
                      ssm=[arena.alloc(f"ssm {n}", ssm) for n in lin],
                      k=[arena.alloc(f"k {n}", kv) for n in full], v=[arena.alloc(f"v {n}", kv) for n in full])


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
    the KV cache in its type, the rows before the call copied once and each pass's new rows read
    back into f32 scratch and encoded into place while later layers compute."""

    def __init__(self, cfg: ModelConfig, state: SequenceState, n_new: int, scratch: np.ndarray):
        """scratch: f32 [2 (k, v), pass_tokens, n_kv_heads, head_dim], page-locked where it can be.
        An attention layer's rows are encoded from it before the next layer's are copied into it."""
        self.cfg, self.start, self.kv_type = cfg, state.pos, state.kv_type
        self.conv = [np.empty_like(c, dtype=np.float32) for c in state.conv]
        self.ssm = [np.empty((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32) for _ in state.ssm]
        self.scratch = scratch
        shape = kv_shape(state.pos + n_new, cfg.n_kv_heads, cfg.head_dim, state.kv_type)
        self.k, self.v = ([self._after(old, shape) for old in olds] for olds in (state.k, state.v))

    @staticmethod
    def scratch_shape(cfg: ModelConfig, pass_tokens: int) -> tuple[int, ...]:
        return (2, pass_tokens if cfg.full_layers else 0, cfg.n_kv_heads, cfg.head_dim)

    def _after(self, old: np.ndarray, shape) -> np.ndarray:
        out = np.empty(shape, kv_dtype(self.kv_type))
        out[:self.start] = old[:self.start]
        return out

    def sink(self, slot: int, dev, layer: int, pos: int, T: int, last: bool) -> list:
        """(host array, device address) pairs of one layer's state to read back after this pass."""
        if self.cfg.is_full_attention(layer):
            row = self.cfg.n_kv_heads * self.cfg.head_dim * F32
            k, v = self.scratch
            return [(k[:T], dev.k[slot] + pos * row), (v[:T], dev.v[slot] + pos * row)]
        return [(self.conv[slot], dev.conv[slot]), (self.ssm[slot], dev.ssm[slot])] if last else []

    def encoder(self, slot: int, pos: int, T: int):
        """The call that encodes the rows the last sink read back into the cache's type in place;
        it must run before the next attention layer's rows are copied into the scratch."""
        return lambda: self._encode(slot, pos, T)

    def _encode(self, slot: int, pos: int, T: int) -> None:
        for rows, cache in zip(self.scratch, (self.k[slot], self.v[slot])):
            kv_encode(rows[:T], self.kv_type, out=cache[pos:pos + T])

    def into(self, state: SequenceState, end: int) -> None:
        """Set `state` to this call's result, `end` positions long."""
        state.pos, state.conv, state.ssm, state.k, state.v = end, self.conv, self.ssm, self.k, self.v
