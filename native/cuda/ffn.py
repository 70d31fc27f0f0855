"""A layer's FFN on the GPU behind one interface (begin_call, prefetch at the layer's start, run
after its post-attention norm), by the config's `ffn_kind`: the MoE (LayerRunner.moe, layers.py),
or the dense FFN of qwen35, x += down(silu(gate xn) * up xn) over a pass's T tokens.

A dense model's layers [0, plan.ffn_layers) read their FFN resident. Every other layer's streams
into the next region of the slot ring (stream.py), issued as the layers before it start, at most
`regions` layers ahead (a region is claimed only after the layer that held it released it), so
that its copy runs under their work; the compute stream waits on it just before its gate GEMM.
"""
from __future__ import annotations

from .kernels import GEMM_BM
from .plan import DENSE_FFN_TENSORS, ffn_offsets


class DenseFFN:
    def __init__(self, runner):
        self.r = runner
        plan, cfg = runner.st.plan, runner.cfg
        self.resident, self.n_layers, self.regions = plan.ffn_layers, cfg.n_layers, plan.regions
        sizes = {n: t.nbytes for n, t in runner.model.tensors.items()}
        self.offsets = {i: ffn_offsets(sizes, i) for i in range(self.resident, cfg.n_layers)}
        self.pending: dict[int, tuple] = {}     # layer -> (region, tensor -> address, arrived event)

    def begin_call(self) -> None:
        self.pending.clear()

    def prefetch(self, i: int, T: int) -> None:
        """At the start of layer i: the streamed FFNs of layers i .. i + regions - 1 on their way."""
        for j in range(max(i, self.resident), min(i + self.regions, self.n_layers)):
            if j not in self.pending:
                self.pending[j] = self.r.st.issue_ffn(j, self.offsets[j])

    def run(self, i: int, start) -> None:
        r = self.r
        cfg, k, s, T = r.cfg, r.k, r.s, r.T
        H, F = cfg.hidden_size, cfg.dense_ffn
        xn, x, W = r.ws["keep"]["xn"], r.ws["keep"]["x"], r.ws["ffn"]
        tensors = r.layers[i]
        region = None
        if i < self.resident:
            addr = {t: r.w[i, t].ptr for t in DENSE_FFN_TENSORS}
        else:
            region, addr, ready = self.pending.pop(i)
            with r.clock("copy wait"):
                s.wait_for_event(ready)
        gemm = dict(tiles=r.ws["keep"]["tiles"], n_tiles=-(-T // GEMM_BM))
        with r.clock("FFN gate/up", flops=2 * 2 * T * F * H):
            for t, y in (("ffn_gate", W["g"]), ("ffn_up", W["u"])):
                w = tensors[t]
                k.gemm(s, w.qtype, x=xn, ldx=H, y=y, ldy=F, w=addr[t], row_bytes=w.row_bytes, N=F, K=H, **gemm)
            k.silu_mul(s, W["g"], W["u"], W["g"], T * F)
        with r.clock("FFN down", flops=2 * T * F * H):
            w = tensors["ffn_down"]
            k.gemm(s, w.qtype, x=W["g"], ldx=F, y=x, ldy=H, w=addr["ffn_down"], row_bytes=w.row_bytes,
                   N=H, K=F, accumulate=True, **gemm)
        if region is not None:
            r.st.release(region, s)
        r.tl.end(s, start)


class MoeFFN:
    """LayerRunner's MoE (its routing, expert schedule and GEMMs are in layers.py and experts.py)."""

    def __init__(self, runner):
        self.r = runner

    def begin_call(self) -> None:
        self.r.experts.pending.clear()

    def prefetch(self, i: int, T: int) -> None:
        self.r.experts.prefetch(i, T)

    def run(self, i: int, start) -> None:
        self.r.moe(i, start)


FFNS = {"moe": MoeFFN, "dense": DenseFFN}      # by ModelConfig.ffn_kind


def ffn_for(runner):
    return FFNS[runner.cfg.ffn_kind](runner)
