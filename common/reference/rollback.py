"""Recurrent-state slots of a speculative verify, and keeping the accepted rows of one.

A verify of n rows saves the recurrent state (conv tail and Gated DeltaNet matrix of every linear
layer) after rows 0 .. n-2 in slots 0 .. n-2; the state holds the one after the last row. Keeping
r < n rows swaps slot r-1's arrays into the state and cuts the full-attention KV to the kept rows.
"""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from ..state import STATE_DTYPE, RollbackSlots, SequenceState


def _conv_shape(cfg: ModelConfig) -> tuple[int, int]:
    return (cfg.conv_channels, cfg.conv_kernel - 1)


def _ssm_shape(cfg: ModelConfig) -> tuple[int, int, int]:
    return (cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim)


def new_rollback(cfg: ModelConfig, slots: int) -> RollbackSlots:
    if slots < 0:
        raise ValueError(f"rollback slots must be >= 0, got {slots}")
    n_lin = len(cfg.linear_layers)
    return RollbackSlots(
        conv=[[np.zeros(_conv_shape(cfg), STATE_DTYPE) for _ in range(n_lin)] for _ in range(slots)],
        ssm=[[np.zeros(_ssm_shape(cfg), STATE_DTYPE) for _ in range(n_lin)] for _ in range(slots)])


def rollback_bytes(cfg: ModelConfig, slots: int) -> int:
    per_layer = int(np.prod(_conv_shape(cfg))) + int(np.prod(_ssm_shape(cfg)))
    return slots * len(cfg.linear_layers) * per_layer * np.dtype(STATE_DTYPE).itemsize


def check_rollback(rollback: RollbackSlots | None, rows: int, which: int) -> None:
    """ValueError unless a verify of `rows` rows of sequence `which` has the slots it needs."""
    if rows < 1:
        raise ValueError(f"verify: sequence {which} has no tokens")
    if rows > 1 and (rollback is None or len(rollback.conv) < rows - 1 or len(rollback.ssm) < rows - 1):
        have = "none" if rollback is None else f"{min(len(rollback.conv), len(rollback.ssm))}"
        raise ValueError(f"verify: sequence {which} runs {rows} rows and needs {rows - 1} rollback slots, "
                         f"it has {have}")


def save_slot(state: SequenceState, rollback: RollbackSlots, slot: int) -> None:
    """Copy the state's recurrent arrays into `slot` (the state after one verified row)."""
    for n in range(len(state.conv)):
        rollback.conv[slot][n][...] = state.conv[n]
        rollback.ssm[slot][n][...] = state.ssm[n]


def keep(state: SequenceState, rollback: RollbackSlots | None, rows: int, ran: int) -> None:
    """After a verify of `ran` rows, keep the first `rows` of them (no recompute)."""
    if not 1 <= rows <= ran:
        raise ValueError(f"keep: rows must be in [1, {ran}], got {rows}")
    if rows == ran:
        return
    if rollback is None or len(rollback.conv) < rows:
        raise ValueError(f"keep: {rows} of {ran} rows needs rollback slot {rows - 1}")
    state.pos -= ran - rows
    state.k = [k[:state.pos].copy() for k in state.k]
    state.v = [v[:state.pos].copy() for v in state.v]
    slot = rows - 1
    for n in range(len(state.conv)):
        state.conv[n], rollback.conv[slot][n] = rollback.conv[slot][n], state.conv[n]
        state.ssm[n], rollback.ssm[slot][n] = rollback.ssm[slot][n], state.ssm[n]
