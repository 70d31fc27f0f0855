"""The numpy twins of native/cuda/kernels.py's `Kernels`, on tests/cuda_emulator.py's memory: each
method computes what its CUDA kernel does, with the same arguments, at issue time."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from common.reference.deltanet import chunked_rule
from common.reference.moe import route
from common.reference.ops import l2_norm, rms_norm, sigmoid, silu
from native.cuda.kernels import GATE_UP_KERNELS, GEMM_KERNELS, ROWS_KERNELS, KernelError, _gemm_checked


def _f(mem, ptr, rows, cols, ld):
    return mem.view(ptr, (rows, cols), np.float32, (ld * 4, 4))


class FakeKernels:
    """Each method mirrors native.cuda.kernels.Kernels."""

    def __init__(self, driver):
        self.m = driver.mem

    def _tiles(self, qtype, x, ldx, xrows, w, woff, row_bytes, tiles, n_tiles, N, K, bm=64):
        """(row0, nrows, X[tile rows] @ W[group]^T) for each tile, as the GEMM kernels see them."""
        m, weights = self.m, {}
        for group, row0, nrows, _ in m.view(tiles, (n_tiles, 4), np.int32).tolist():
            assert 0 < nrows <= bm
            base = w + (int(m.view(woff + 8 * group, 1, np.int64)[0]) if woff else 0)
            if base not in weights:
                raw = m.view(base, (N, row_bytes), np.uint8)
                weights[base] = raw.view(np.float32) if qtype == Q.F32 else dequantize(raw, Q(qtype))
            src = m.view(xrows + 4 * row0, nrows, np.int32) if xrows else np.arange(row0, row0 + nrows)
            X = m.view(x, (int(max(src)) + 1, K), np.float32, (ldx * 4, 4))[src]
            yield row0, nrows, X @ weights[base].T

    def gemm(self, stream, qtype, *, x, ldx, y, ldy, w, row_bytes, tiles, n_tiles, N, K,
             xrows=0, woff=0, accumulate=False, bm=64):
        if not _gemm_checked(GEMM_KERNELS, qtype, x, ldx, K, n_tiles):     # the real one's type registry
            return
        for row0, nrows, prod in self._tiles(qtype, x, ldx, xrows, w, woff, row_bytes, tiles, n_tiles, N, K, bm):
            Y = _f(self.m, y + row0 * ldy * 4, nrows, N, ldy)
            Y[:] = (Y if accumulate else 0) + prod

    def gemm_gate_up(self, stream, qtype, *, x, ldx, y, ldy, woff, woff_up, row_bytes, tiles, n_tiles, N, K,
                     xrows=0, w=0):
        if not _gemm_checked(GATE_UP_KERNELS, qtype, x, ldx, K, n_tiles):
            return
        gate, up = (self._tiles(qtype, x, ldx, xrows, w, t, row_bytes, tiles, n_tiles, N, K) for t in (woff, woff_up))
        for (row0, nrows, g), (_, _, u) in zip(gate, up):
            _f(self.m, y + row0 * ldy * 4, nrows, N, ldy)[:] = silu(g) * u

    def dequant_rows(self, stream, qtype, w, row_bytes, rows, out, n, K):
        if qtype not in ROWS_KERNELS:
            raise KernelError(f"no row dequantizer for {Q(qtype).name}")
        idx = self.m.view(rows, n, np.int32) if rows else np.arange(n)
        raw = self.m.view(w, (int(idx.max()) + 1, row_bytes), np.uint8)[idx]
        self.m.view(out, (n, K))[:] = raw.view(np.float32) if qtype == Q.F32 else dequantize(raw, Q(qtype))

    def rms_norm(self, stream, x, ldx, hsx, y, ldy, hsy, w, rows, per, dim, eps):
        T = rows // per
        X = self.m.view(x, (T, per, dim), np.float32, (ldx * 4, hsx * 4, 4)).copy()
        Y = self.m.view(y, (T, per, dim), np.float32, (ldy * 4, hsy * 4, 4))
        Y[:] = rms_norm(X, self.m.view(w, dim), eps)

    def rms_norm_gated(self, stream, x, z, y, w, rows, dim, eps):
        X, Z = self.m.view(x, (rows, dim)), self.m.view(z, (rows, dim))
        self.m.view(y, (rows, dim))[:] = rms_norm(X.copy(), self.m.view(w, dim), eps) * silu(Z)

    def l2_norm(self, stream, x, ldx, rows, per, dim, eps, scale):
        X = self.m.view(x, (rows // per, per, dim), np.float32, (ldx * 4, dim * 4, 4))
        X[:] = l2_norm(X.copy(), eps) * np.float32(scale)

    def rope(self, stream, x, ldx, heads, hd, rope_dim, cs, T):
        X = self.m.view(x, (T, heads, hd), np.float32, (ldx * 4, hd * 4, 4))
        half = rope_dim // 2
        c = self.m.view(cs, (T, half, 2))
        cos, sin = c[:, None, :, 0], c[:, None, :, 1]
        a, b = X[..., :half].copy(), X[..., half:rope_dim].copy()
        X[..., :half] = a * cos - b * sin
        X[..., half:rope_dim] = b * cos + a * sin

    def conv1d(self, stream, x, state, w, out, T, C, K):
        X, S = self.m.view(x, (T, C)), self.m.view(state, (C, K - 1))
        Wc = self.m.view(w, (C, K))
        window = np.concatenate([S.T, X], axis=0)
        self.m.view(out, (T, C))[:] = silu(sum(window[j:j + T] * Wc[:, j] for j in range(K)))
        S[:] = window[-(K - 1):].T

    def gdn_gates(self, stream, alpha, beta, ssm_a, dt_bias, T, nv):
        A, B = self.m.view(alpha, (T, nv)), self.m.view(beta, (T, nv))
        A[:] = self.m.view(ssm_a, nv) * np.logaddexp(0.0, A + self.m.view(dt_bias, nv))
        B[:] = sigmoid(B)

    def gdn_chunked(self, stream, qkv, g, beta, shape, gcum, aqk, u, wk, state, o):
        T, C, nk, nv, dk, dv, tiled = shape
        X = self.m.view(qkv, (T, C))
        heads = np.arange(nv) % nk if tiled else np.arange(nv) // (nv // nk)
        q = X[:, :nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2)
        k = X[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)[:, heads].transpose(1, 0, 2)
        v = X[:, 2 * nk * dk:].reshape(T, nv, dv).transpose(1, 0, 2)
        S = self.m.view(state, (nv, dk, dv))
        out, S[:], _ = chunked_rule(q, k, v, self.m.view(g, (T, nv)).T, self.m.view(beta, (T, nv)).T, S.copy(), 64)
        self.m.view(o, (T, nv * dv))[:] = out.transpose(1, 0, 2).reshape(T, nv * dv)

    def attention(self, stream, q, kc, vc, gate, ldg, hsg, out, T, pos0, nh, nkv, hd):
        Qm = self.m.view(q, (T, nh, hd))
        S = pos0 + T
        Kc, Vc = self.m.view(kc, (S, nkv, hd)), self.m.view(vc, (S, nkv, hd))
        G = self.m.view(gate, (T, nh, hd), np.float32, (ldg * 4, hsg * 4, 4))
        grp = nh // nkv
        kh = np.repeat(Kc, grp, axis=1).transpose(1, 2, 0)
        vh = np.repeat(Vc, grp, axis=1).transpose(1, 0, 2)
        sc = (Qm.transpose(1, 0, 2) @ kh) / np.float32(np.sqrt(hd))
        causal = (pos0 + np.arange(T))[:, None] >= np.arange(S)[None, :]
        sc = np.where(causal[None], sc, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        self.m.view(out, (T, nh, hd))[:] = (p @ vh).transpose(1, 0, 2) * sigmoid(G)

    def moe_route(self, stream, logits, ids, w, T, E, k):
        i, wt = route(self.m.view(logits, (T, E)), k)
        self.m.view(ids, (T, k), np.int32)[:] = i
        self.m.view(w, (T, k))[:] = wt

    def moe_count(self, stream, ids, counts, n):
        np.add.at(self.m.view(counts, 1 << 10, np.int32), self.m.view(ids, n, np.int32), 1)

    def moe_tiles(self, stream, counts, cursor, tiles, E, bm):
        c = self.m.view(counts, E, np.int32).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(c)[:-1]])
        self.m.view(cursor, E, np.int32)[:] = first
        ntile = -(-c // bm)
        expert = np.repeat(np.arange(E), ntile)
        local = np.arange(len(expert)) - np.concatenate([[0], np.cumsum(ntile)[:-1]])[expert]
        rows = np.stack([expert, first[expert] + local * bm, np.minimum(bm, c[expert] - local * bm),
                         np.zeros_like(expert)], axis=1)
        self.m.view(tiles, rows.shape, np.int32)[:] = rows

    def moe_scatter(self, stream, ids, cursor, tok, pos, n, k):
        experts = self.m.view(ids, n, np.int32)
        cur = self.m.view(cursor, int(experts.max()) + 1, np.int32)
        for i, e in enumerate(experts):
            self.m.view(tok, n, np.int32)[cur[e]] = i // k
            self.m.view(pos, n, np.int32)[i] = cur[e]
            cur[e] += 1

    def silu_mul(self, stream, gate, up, act, n):
        self.m.view(act, n)[:] = silu(self.m.view(gate, n).copy()) * self.m.view(up, n)

    def moe_combine(self, stream, x, down, pos, w, shared, sg, T, H, k):
        X = self.m.view(x, (T, H))
        P, Wt = self.m.view(pos, (T, k), np.int32), self.m.view(w, (T, k))
        D = self.m.view(down, (int(P.max()) + 1, H))
        acc = np.einsum("tk,tkh->th", Wt, D[P])
        if shared:
            gate = sigmoid(self.m.view(sg, T))[:, None] if sg else 1.0
            acc = acc + gate * self.m.view(shared, (T, H))
        X += acc
