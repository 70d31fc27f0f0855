"""Checkpoints of one CUDA prefill call (common.state.Checkpoint), captured inside its passes.

Within a pass a linear layer's chunked DeltaNet scan is cut at each checkpoint of the pass and
the recurrent state read back after the cut; the chunks then restart there, as in a prefill that
stopped at it, so a checkpoint at a multiple of the scan's chunk (GDN_CHUNK, 64 rows) from the
pass's start leaves the chunks, and so the results, of a call without it. The conv tail at a
checkpoint is the K-1 projection rows before it (the pass's starting tail for a checkpoint in its
first K-1 rows), read back before the conv kernel; the hidden row before it is read back after
the last layer, and every checkpoint's logits come from one LM-head call at the end (head.py).
All copies run on the compute stream, in order with the kernels that overwrite their sources.
"""
from __future__ import annotations

import numpy as np

from common.state import Checkpoint

from .layers import F32


class CallCheckpoints:
    def __init__(self, cfg, start: int, marks: list[int]):
        """marks: offsets into the call (0 < m < n, increasing); start: the call's first position."""
        self.cfg, self.start, self.marks = cfg, start, marks
        K1, C, n_lin = cfg.conv_kernel - 1, cfg.conv_channels, len(cfg.linear_layers)
        self.rows = [[np.empty((K1, C), np.float32) for _ in range(n_lin)] for _ in marks]
        # (mark, slot) -> (the pass's starting tail [C, K-1], r: the pass's rows before the mark)
        self.tails: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
        self.ssm = [[np.empty((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32) for _ in range(n_lin)]
                    for _ in marks]
        self.hidden = np.empty((len(marks) + 1, cfg.hidden_size), np.float32)    # and the call's last row

    def in_pass(self, p0: int, T: int) -> list[tuple[int, int]]:
        """(mark index, row r of the pass, 0 < r <= T) of the marks that the pass [p0, p0+T) ends."""
        return [(j, m - p0) for j, m in enumerate(self.marks) if p0 < m <= p0 + T]

    def conv(self, cuda, cuts, slot: int, qkv: int, conv_state: int, s) -> None:
        """Read back the projection rows (qkv: [T, C]) before each cut, and where a cut falls in
        the first K-1 rows the layer's conv tail before this pass (conv_state, before the conv
        kernel replaces it)."""
        K1, C = self.cfg.conv_kernel - 1, self.cfg.conv_channels
        for j, r in cuts:
            have = min(r, K1)
            if have:
                cuda.memcpy_dtoh_async(self.rows[j][slot][K1 - have:], qkv + (r - have) * C * F32, s)
            if have < K1:
                tail = np.empty((C, K1), np.float32)
                self.tails[j, slot] = tail, r
                cuda.memcpy_dtoh_async(tail, conv_state, s)

    def scan_bounds(self, cuts, T: int) -> list[tuple[int, int, list[int]]]:
        """The scan's pieces of a pass of T rows: (first row, end row, marks read back after it)."""
        ends = [r for _, r in cuts if r < T] + [T]
        return [(a, b, [j for j, r in cuts if r == b]) for a, b in zip([0, *ends[:-1]], ends)]

    def ssm_after(self, cuda, j: int, slot: int, ssm_state: int, s) -> None:
        cuda.memcpy_dtoh_async(self.ssm[j][slot], ssm_state, s)

    def hidden_rows(self, cuda, cuts, x: int, s) -> None:
        """The hidden row before each cut (x: the pass's [T, hidden] after the last layer)."""
        H = self.cfg.hidden_size
        for j, r in cuts:
            cuda.memcpy_dtoh_async(self.hidden[j], x + (r - 1) * H * F32, s)

    def take(self, logits: np.ndarray) -> list[Checkpoint]:
        """The Checkpoints, once the copies have landed; logits: [marks, vocab] of their rows."""
        K1 = self.cfg.conv_kernel - 1
        out = []
        for j, m in enumerate(self.marks):
            conv = []
            for slot, rows in enumerate(self.rows[j]):
                if (j, slot) in self.tails:             # the last K-1-r inputs before the pass, then its r
                    tail, r = self.tails[j, slot]
                    rows[:K1 - r] = tail.T[r:]
                conv.append(np.ascontiguousarray(rows.T))
            out.append(Checkpoint(self.start + m, conv, self.ssm[j], logits[j]))
        return out
