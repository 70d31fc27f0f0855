"""The final norm and LM head of the CUDA prefill: hidden rows on the device -> logits on the
host. The head is resident or streamed through the slot ring in row blocks (plan.py), so a
call of up to head_rows rows crosses the bus once."""
from __future__ import annotations

import numpy as np

from .layers import F32
from .plan import head_rows
from .tables import dense_tiles


class LMHead:
    def __init__(self, cuda, kernels, cfg, weights, ws, plan, streamer, compute, host_source: np.ndarray | None):
        """host_source: the head's raw rows on the host, when it is streamed."""
        self.cuda, self.k, self.cfg, self.w, self.ws = cuda, kernels, cfg, weights, ws
        self.plan, self.streamer, self.s, self.host = plan, streamer, compute, host_source

    def __call__(self, x: int, nrows: int) -> np.ndarray:
        """Final norm and LM head for nrows hidden rows at x -> [nrows, vocab]."""
        cuda, cfg, k, s = self.cuda, self.cfg, self.k, self.s
        H, V, hw = cfg.hidden_size, cfg.vocab_size, self.w.head_tensor
        head = self.ws["head"]
        per = head_rows(cfg, self.plan.pass_tokens)
        out = np.empty((nrows, V), np.float32)
        xn = self.ws["keep"]["xn"]
        for r0 in range(0, nrows, per):
            n = min(per, nrows - r0)
            k.rms_norm(s, x + r0 * H * F32, H, 0, xn, H, 0, self.w["output_norm.weight"].ptr,
                       n, 1, H, cfg.rms_eps)
            tiles = dense_tiles(n).reshape(-1)
            cuda.memcpy_htod_async(head["tiles"], tiles, s)
            gemm = dict(x=xn, ldx=H, ldy=V, tiles=head["tiles"], n_tiles=-(-n // 64), K=H,
                        row_bytes=hw.row_bytes)
            if self.plan.head_resident:
                k.gemm(s, hw.qtype, y=head["logits"], w=self.w["head"].ptr, N=V, **gemm)
            else:
                rows = max(1, self.plan.region_bytes // hw.row_bytes)
                for n0 in range(0, V, rows):
                    n1 = min(V, n0 + rows)
                    region, addr, ready = self.streamer.issue_rows(self.host[n0:n1])
                    s.wait_for_event(ready)
                    k.gemm(s, hw.qtype, y=head["logits"] + n0 * F32, w=addr, N=n1 - n0, **gemm)
                    self.streamer.release(region, s)
            s.synchronize()
            cuda.memcpy_dtoh(out[r0:r0 + n], head["logits"])
        return out

    def of_host_rows(self, rows: np.ndarray, x: int) -> np.ndarray:
        """The logits of hidden rows kept on the host [n, hidden]: up into x (room for pass_tokens
        rows, free once the layers are done) a pass's worth at a time."""
        P = self.plan.pass_tokens
        out = []
        for r0 in range(0, len(rows), P):
            part = np.ascontiguousarray(rows[r0:r0 + P], np.float32)
            self.cuda.memcpy_htod_async(x, part, self.s)
            out.append(self(x, len(part)))
        return np.concatenate(out, axis=0) if out else np.empty((0, self.cfg.vocab_size), np.float32)
