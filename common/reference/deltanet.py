"""Gated DeltaNet (linear attention) layer: chunked form for prefill, recurrent for decode.

Per value head, in float32: q and k are L2-normalised and q is scaled by 1/sqrt(d_k);
beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias); each step
S <- S * exp(g); S <- S + k (x) beta * (v - S^T k); o = S^T q.
"""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from ..model.layers import fused_ba_rows
from .ops import l2_norm, rms_norm, sigmoid, silu, softplus
from .weights import LayerWeights

# tokens per chunk of the chunked form; prefill checkpoints fall on its multiples, so a prompt
# prefilled in segments is chunked as it is whole
PREFILL_CHUNK = 64


class GatedDeltaNet:
    def __init__(self, cfg: ModelConfig, w: LayerWeights):
        self.cfg, self.w = cfg, w
        self.key_heads = np.array([cfg.key_head_of(h) for h in range(cfg.n_v_heads)])   # [nv]
        if cfg.fused_ba:
            self.beta_rows, self.alpha_rows = fused_ba_rows(cfg)

    def _beta_alpha(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.cfg.fused_ba:
            ba = x @ self.w["ba"].T
            return ba[:, self.beta_rows], ba[:, self.alpha_rows]
        return x @ self.w["beta"].T, x @ self.w["alpha"].T

    def forward(self, x: np.ndarray, conv_state: np.ndarray, ssm_state: np.ndarray, recurrent: bool,
                chunk: int = PREFILL_CHUNK, marks: tuple[int, ...] = ()) -> tuple[np.ndarray, ...]:
        """x: [T, hidden] -> ([T, hidden], new conv state, new ssm state, [(conv, ssm) after each
        of the chunked form's `marks`]: row offsets 0 < m < T, where its chunks are cut)."""
        cfg, w = self.cfg, self.w
        T = x.shape[0]
        nk, nv, dk, dv = cfg.n_k_heads, cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim
        mixed = x @ w["qkv"].T                                              # [T, C]
        z = (x @ w["z"].T).reshape(T, nv, dv)
        b, a = self._beta_alpha(x)                                           # [T, nv]

        # causal depthwise conv1d over [state tail, new inputs], then SiLU
        kernel = w["conv_w"]                                                 # [C, K]
        K = kernel.shape[1]
        window = np.concatenate([conv_state.T, mixed], axis=0)               # [K-1+T, C]
        conv = sum(window[j:j + T] * kernel[:, j] for j in range(K))
        new_conv = window[-(K - 1):].T.copy() if K > 1 else conv_state
        convs = [window[m:m + K - 1].T.copy() if K > 1 else conv_state for m in marks]
        mixed = silu(conv)

        q = mixed[:, :nk * dk].reshape(T, nk, dk)[:, self.key_heads]        # [T, nv, dk]
        k = mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)[:, self.key_heads]
        v = mixed[:, 2 * nk * dk:].reshape(T, nv, dv)
        q = l2_norm(q) / np.float32(np.sqrt(dk))
        k = l2_norm(k)
        beta = sigmoid(b)
        g = w["ssm_a"] * softplus(a + w["dt_bias"])                          # [T, nv], ssm_a = -exp(A_log)

        # heads first: [nv, T, d]
        q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))
        beta, g = beta.T, g.T
        if recurrent and marks:
            raise ValueError("checkpoints are taken by the chunked form alone")
        if recurrent:
            o, S, ssms = *recurrent_rule(q, k, v, g, beta, ssm_state), []
        else:
            o, S, ssms = chunked_rule(q, k, v, g, beta, ssm_state, chunk, marks)
        o = o.transpose(1, 0, 2)                                             # [T, nv, dv]

        o = rms_norm(o, w["ssm_norm"], cfg.rms_eps) * silu(z)
        return o.reshape(T, nv * dv) @ w["ssm_out"].T, new_conv, S, list(zip(convs, ssms))


def recurrent_rule(q, k, v, g, beta, S):
    """Token by token. q, k: [H, T, dk]; v: [H, T, dv]; g, beta: [H, T]; S: [H, dk, dv]."""
    S = S.copy()
    out = np.empty_like(v)
    for t in range(q.shape[1]):
        S *= np.exp(g[:, t])[:, None, None]
        kv = np.einsum("hk,hkv->hv", k[:, t], S)
        delta = (v[:, t] - kv) * beta[:, t, None]
        S += k[:, t, :, None] * delta[:, None, :]
        out[:, t] = np.einsum("hk,hkv->hv", q[:, t], S)
    return out, S


def chunked_rule(q, k, v, g, beta, S, chunk: int, marks=()):
    """The same recurrence, `chunk` tokens at a time with a UT transform inside each chunk. Chunks
    restart at each of `marks` (as in a prefill that stopped there), whose states come back:
    (out, S, [S after each mark])."""
    S = S.copy()
    H, T, _ = q.shape
    out = np.empty_like(v)
    at_marks = []
    bounds = [0, *marks, T]
    spans = [(s, min(s + chunk, b)) for a, b in zip(bounds, bounds[1:]) for s in range(a, b, chunk)]
    for s, e in spans:
        qc, kc, vc, bc = q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e]
        G = np.cumsum(g[:, s:e], axis=1)                                     # [H, C]
        C = e - s
        lower = np.tril(np.ones((C, C), bool))
        decay = np.where(lower, np.exp(np.minimum(G[:, :, None] - G[:, None, :], 0.0)), 0.0)
        kb = kc * bc[..., None]
        A = np.where(np.tril(np.ones((C, C), bool), -1), (kb @ kc.transpose(0, 2, 1)) * decay, 0.0)
        system = (np.eye(C) + A).astype(np.float64)                          # unit lower triangular
        rhs = np.concatenate([vc * bc[..., None], kb * np.exp(G)[..., None]], axis=-1)
        sol = np.linalg.solve(system, rhs.astype(np.float64)).astype(np.float32)
        u, w = sol[..., :vc.shape[-1]], sol[..., vc.shape[-1]:]
        v_new = u - w @ S                                                    # [H, C, dv]
        attn = (qc @ kc.transpose(0, 2, 1)) * decay                          # [H, C, C]
        out[:, s:e] = (qc * np.exp(G)[..., None]) @ S + attn.astype(np.float32) @ v_new
        last = G[:, -1:]
        S = S * np.exp(last)[..., None] + (kc * np.exp(last - G)[..., None]).transpose(0, 2, 1) @ v_new
        if e in marks:
            at_marks.append(S.astype(np.float32))
    return out, S.astype(np.float32), at_marks
