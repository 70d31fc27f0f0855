"""A sequence's state between the host and the CUDA prefill's device state (native/cuda/layers.py
StateBlock): up before a prompt (KV decoded to f32), and the host arrays and per-layer read-backs
of the state after it."""
from __future__ import annotations

import numpy as np

from common.kv_cache import kv_decode
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


def host_state(cfg: ModelConfig, state: SequenceState, end: int) -> SequenceState:
    """f32 host arrays for the state after this call; KV rows before state.pos are left unset
    (the caller keeps the state's own)."""
    kv = [np.empty((end, cfg.n_kv_heads, cfg.head_dim), np.float32) for _ in state.k + state.v]
    n = len(state.k)
    return SequenceState(end, [np.empty_like(c, dtype=np.float32) for c in state.conv],
                         [np.empty((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32)
                          for _ in state.ssm], kv[:n], kv[n:])


def layer_sink(cfg: ModelConfig, slot: int, dev, out: SequenceState, layer: int, pos: int, T: int,
               last: bool) -> list:
    """State of one layer to read back: this pass's KV rows, and the final recurrent state."""
    if cfg.is_full_attention(layer):
        row = cfg.n_kv_heads * cfg.head_dim * F32
        return [(out.k[slot][pos:pos + T], dev.k[slot] + pos * row),
                (out.v[slot][pos:pos + T], dev.v[slot] + pos * row)]
    return [(out.conv[slot], dev.conv[slot]), (out.ssm[slot], dev.ssm[slot])] if last else []
