"""The Gated DeltaNet mixer of one layer on the GPU, a base of LayerRunner (layers.py): input
projections, the causal conv, L2 norms and gates, the chunked scan, the gated norm and the
output projection. With checkpoints in the pass (`self.checkpoints`, checkpoints.py, and
`self.cuts`: (checkpoint, row) pairs), the scan is cut at each and the state there read back."""
from __future__ import annotations

import numpy as np

from .plan import F32

L2_EPS = 1e-6          # the reference's l2_norm epsilon


class LinearMixer:
    def linear(self, i: int, n: int) -> None:
        cfg, k, s, T, L = self.cfg, self.k, self.s, self.T, self.ws["linear"]
        H, C, nk, nv, dk, dv = (cfg.hidden_size, cfg.conv_channels, cfg.n_k_heads, cfg.n_v_heads,
                                cfg.head_k_dim, cfg.head_v_dim)
        xn = self.ws["keep"]["xn"]
        with self.clock("deltanet input projections"):
            self.dense((i, "qkv"), xn, H, L["qkv"], C)
            self.dense((i, "z"), xn, H, L["z"], nv * dv)
            self.dense((i, "beta"), xn, H, L["beta"], nv)                # a fused ssm_ba is split at upload
            self.dense((i, "alpha"), xn, H, L["alpha"], nv)
        with self.clock("deltanet conv, l2 norms, gates"):
            if self.cuts:
                self.checkpoints.conv(self.cuda, self.cuts, n, L["qkv"], self.state.conv[n], s)
            k.conv1d(s, L["qkv"], self.state.conv[n], self.w[i, "conv_w"].ptr, L["conv"],
                     T, C, cfg.conv_kernel)
            k.l2_norm(s, L["conv"], C, T * nk, nk, dk, L2_EPS, float(1.0 / np.sqrt(dk)))
            k.l2_norm(s, L["conv"] + nk * dk * F32, C, T * nk, nk, dk, L2_EPS, 1.0)
            k.gdn_gates(s, L["alpha"], L["beta"], self.w[i, "ssm_a"].ptr, self.w[i, "dt_bias"].ptr, T, nv)
        with self.clock("deltanet chunk prep and scan"):
            self._scan(n)
        with self.clock("deltanet gated norm"):
            k.rms_norm_gated(s, L["o"], L["z"], L["o"], self.w[i, "ssm_norm"].ptr, T * nv, dv, cfg.rms_eps)
        with self.clock("deltanet output projection"):
            self.dense((i, "ssm_out"), L["o"], nv * dv, self.ws["keep"]["x"], H, accumulate=True)

    def _scan(self, n: int) -> None:
        """The chunked scan over the pass's rows, in pieces ending at its checkpoints (one piece
        without), the recurrent state read back after each piece that ends on one."""
        cfg, L, T = self.cfg, self.ws["linear"], self.T
        C, nv, dv = cfg.conv_channels, cfg.n_v_heads, cfg.head_v_dim
        pieces = self.checkpoints.scan_bounds(self.cuts, T) if self.cuts else [(0, T, [])]
        for a, b, marks in pieces:
            self.k.gdn_chunked(self.s, L["conv"] + a * C * F32, L["alpha"] + a * nv * F32, L["beta"] + a * nv * F32,
                               (b - a, C, cfg.n_k_heads, nv, cfg.head_k_dim, dv, int(cfg.v_head_layout == "tiled")),
                               L["gcum"], L["aqk"], L["u"], L["wk"], self.state.ssm[n], L["o"] + a * nv * dv * F32)
            for j in marks:
                self.checkpoints.ssm_after(self.cuda, j, n, self.state.ssm[n], self.s)
