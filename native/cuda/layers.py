"""One layer of the model on the GPU: the Gated DeltaNet or gated-attention mixer, then the FFN:
the MoE (below), or the dense FFN (ffn.py, which holds both behind one interface), by the
config's `ffn_kind`.

`LayerRunner` owns no memory: it is handed the resident weights, the workspace (device
addresses by phase and name), the state block and the streams. Everything is enqueued on the
compute stream; the only host synchronisation per layer is the routing count, which decides
which experts cross the bus. Nothing is uploaded on the compute stream inside a layer: a copy
there would queue behind the streamed experts on the copy engine. With `phases`, a PhaseClock
(phases.py) times each phase of each layer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from common.model.layers import EXPERT_ROLES

from .experts import ExpertSchedule
from .ffn import ffn_for
from .kernels import GEMM_BM
from .linear_mixer import LinearMixer
from .phases import NULL_CLOCK, PhaseClock
from .plan import EXPERT_TENSORS

F32 = 4


@dataclass(frozen=True)
class StateBlock:
    conv: list[int]        # per linear layer: [C, K-1]
    ssm: list[int]         # per linear layer: [nv, dk, dv]
    k: list[int]           # per full layer: [max_context, nkv, hd]
    v: list[int]


class LayerRunner(LinearMixer):
    def __init__(self, cuda, kernels, cfg, weights, streamer, ws, state: StateBlock, compute,
                 timeline, host_scratch, model, phases: bool = False):
        self.cuda, self.k, self.cfg, self.w, self.st = cuda, kernels, cfg, weights, streamer
        self.ws, self.state, self.s, self.tl, self.model = ws, state, compute, timeline, model
        self.slot_of = {i: n for n, i in enumerate(cfg.linear_layers)} | \
                       {i: n for n, i in enumerate(cfg.full_layers)}
        self.counts_h, tables_h = host_scratch
        self.experts = ExpertSchedule(cuda, cfg, streamer, weights, tables_h, ws["keep"]["woff"])
        self.layers = weights.bound.layers       # per layer: role -> Tensor (common/model/layers.py)
        self.eq = {(i, t): tensors[role] for i, tensors in enumerate(self.layers)
                   for t, role in zip(EXPERT_TENSORS, EXPERT_ROLES) if role in tensors}
        self.T = 0
        self.checkpoints, self.cuts = None, []      # this pass's (linear_mixer.py)
        self.d2h = cuda.Stream()
        self.wait_seconds = 0.0         # host blocked on routing counts
        self.host_work: list = []       # (event, call): host work done while the host would wait
        self.clock = PhaseClock(cuda, compute) if phases else NULL_CLOCK
        self.shared_fused = self._shared_tables()
        self.ffn = ffn_for(self)

    def _shared_tables(self) -> bool:
        """Each layer's shared gate and up addresses on the device, for one fused launch; False
        when some layer's gate and up differ in type (they then run as two GEMMs and a SiLU)."""
        if not self.cfg.has_shared_expert:
            return False
        pairs = [(self.w[i, "sh_gate"], self.w[i, "sh_up"]) for i in range(self.cfg.n_layers)]
        if any((g.qtype, g.row_bytes) != (u.qtype, u.row_bytes) for g, u in pairs):
            return False
        table = np.array([(g.ptr, u.ptr) for g, u in pairs], np.int64)
        self.cuda.memcpy_htod(self.ws["keep"]["shared_woff"], table)
        return True

    # ---------------------------------------------------------------- helpers
    def later(self, call) -> None:
        """Run `call` once the d2h stream's copies so far have landed, the next time the host
        waits on the GPU (before a layer's routing counts), instead of holding up the queue now."""
        ev = self.cuda.Event()
        ev.record(self.d2h)
        self.host_work.append((ev, call))

    def begin_call(self) -> None:
        """Forget what a call that failed part way left queued: prefetched plans, host work."""
        self.ffn.begin_call()
        self.host_work.clear()

    def run_host_work(self) -> None:
        for ev, call in self.host_work:
            ev.synchronize()
            call()
        self.host_work.clear()

    def dense(self, key: tuple[int, str], x: int, ldx: int, y: int, ldy: int, accumulate: bool = False) -> None:
        t = self.w[key]
        self.clock.flops(2 * self.T * t.N * t.K)
        self.k.gemm(self.s, t.qtype, x=x, ldx=ldx, y=y, ldy=ldy, w=t.ptr, row_bytes=t.row_bytes,
                    tiles=self.ws["keep"]["tiles"], n_tiles=-(-self.T // GEMM_BM), N=t.N, K=t.K,
                    accumulate=accumulate)

    def norm(self, key: tuple[int, str], x: int, y: int) -> None:
        H = self.cfg.hidden_size
        self.k.rms_norm(self.s, x, H, 0, y, H, 0, self.w[key].ptr, self.T, 1, H, self.cfg.rms_eps)

    # ---------------------------------------------------------------- one layer
    def layer(self, i: int, T: int, pos: int, sink: list | None = None) -> None:
        """Enqueue layer i over T tokens at position pos. `sink`: (host array, device address)
        pairs of this layer's state, read back on the d2h stream while the MoE computes."""
        self.T = T
        keep = self.ws["keep"]
        self.ffn.prefetch(i, T)
        start = self.tl.begin(self.s)
        with self.clock("input norm"):
            self.norm((i, "attn_norm"), keep["x"], keep["xn"])
        if self.cfg.is_full_attention(i):
            self.full(i, self.slot_of[i], pos)
        else:
            self.linear(i, self.slot_of[i])
        mixed = self.cuda.Event()
        mixed.record(self.s)
        with self.clock("post norm"):
            self.norm((i, "post_norm"), keep["x"], keep["xn"])
        self.ffn.run(i, start)
        if sink:
            if self.cfg.is_full_attention(i):
                # the last attention layer's rows leave the scratch first (an MoE's routing wait has
                # already run that; a dense FFN has no wait)
                self.run_host_work()
            self.d2h.wait_for_event(mixed)
            for host, ptr in sink:
                self.cuda.memcpy_dtoh_async(host, ptr, self.d2h)

    def full(self, i: int, n: int, pos: int) -> None:
        cfg, k, s, T, A = self.cfg, self.k, self.s, self.T, self.ws["full"]
        H, nh, nkv, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        xn, row = self.ws["keep"]["xn"], nkv * hd
        kc, vc = self.state.k[n], self.state.v[n]
        knew, vnew = kc + pos * row * F32, vc + pos * row * F32
        with self.clock("attention input projections"):
            self.dense((i, "q"), xn, H, A["q2"], nh * 2 * hd)
            self.dense((i, "k"), xn, H, A["kraw"], row)
            self.dense((i, "v"), xn, H, vnew, row)
        with self.clock("attention q/k norms, rope"):
            k.rms_norm(s, A["q2"], nh * 2 * hd, 2 * hd, A["q"], nh * hd, hd,
                       self.w[i, "q_norm"].ptr, T * nh, nh, hd, cfg.rms_eps)
            k.rms_norm(s, A["kraw"], row, hd, knew, row, hd,
                       self.w[i, "k_norm"].ptr, T * nkv, nkv, hd, cfg.rms_eps)
            cs = self.ws["keep"]["rope"]
            k.rope(s, A["q"], nh * hd, nh, hd, cfg.rope_dim, cs, T)
            k.rope(s, knew, row, nkv, hd, cfg.rope_dim, cs, T)
        with self.clock("attention kernel", flops=2 * nh * 2 * hd * T * (pos + (T + 1) / 2)):
            k.attention(s, A["q"], kc, vc, A["q2"] + hd * F32, nh * 2 * hd, 2 * hd, A["att"], T, pos, nh, nkv, hd)
        with self.clock("attention output projection"):
            self.dense((i, "o"), A["att"], nh * hd, self.ws["keep"]["x"], H, accumulate=True)

    # ---------------------------------------------------------------- MoE
    def moe(self, i: int, start) -> None:
        cfg, k, s, T, M = self.cfg, self.k, self.s, self.T, self.ws["moe"]
        H, E, top = cfg.hidden_size, cfg.n_experts, cfg.n_experts_used
        xn, x = self.ws["keep"]["xn"], self.ws["keep"]["x"]
        with self.clock("router GEMM"):
            self.dense((i, "router"), xn, H, M["logits"], E)
        with self.clock("routing kernels, counts read back"):
            k.moe_route(s, M["logits"], M["ids"], M["w"], T, E, top)
            self.cuda.memset_d32_async(M["counts"], 0, E, s)
            k.moe_count(s, M["ids"], M["counts"], T * top)
            self.cuda.memcpy_dtoh_async(self.counts_h, M["counts"], s)
        routed = self.cuda.Event()
        routed.record(s)
        self.tl.end(s, start)
        start = self.tl.begin(s)                    # the shared expert runs while the host groups
        with self.clock("shared expert"):
            shared = self.shared_expert(i)
        self.tl.end(s, start)
        self.run_host_work()
        t0 = time.perf_counter()
        with self.clock.host("wait for the expert counts"):
            routed.synchronize()
        self.wait_seconds += time.perf_counter() - t0
        counts = self.counts_h[:E].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tile_start = np.concatenate([[0], np.cumsum(-(-counts // GEMM_BM))])     # as moe_tiles builds them
        with self.clock.host("expert tables, first copies issued"):
            lx = self.experts.take(i, counts)

        start = self.tl.begin(s)
        with self.clock("tile build, scatter"):
            k.moe_tiles(s, M["counts"], M["cursor"], M["tiles"], E, GEMM_BM)
            k.moe_scatter(s, M["ids"], M["cursor"], M["tok"], M["pos"], T * top, top)
            s.wait_for_event(lx.tables)
        # the resident experts and every chunk already arrived go in one launch: fewer, fuller grids
        arrived = lx.arrived()
        last = int(lx.chunks[arrived - 1][-1]) if arrived else self.st.plan.pinned_experts - 1
        if last >= 0:
            self.expert_gemms(i, 0, last, counts, offsets, tile_start, lx.woff)
        self.tl.end(s, start)
        for c in range(arrived):
            self.st.release(lx.places[c].region, s)

        for c, (experts, where) in enumerate(zip(lx.chunks, lx.places)):
            if c < arrived:
                continue
            if c not in lx.ready:
                lx.ready[c] = self.st.issue(i, experts, where)
            with self.clock("copy wait"):
                s.wait_for_event(lx.ready[c])
            start = self.tl.begin(s)
            self.expert_gemms(i, int(experts[0]), int(experts[-1]), counts, offsets, tile_start, lx.woff)
            self.tl.end(s, start)
            self.st.release(where.region, s)

        start = self.tl.begin(s)
        sg = M["sg"] if shared and self.layers[i]["sh_gate_inp"] is not None else 0
        with self.clock("expert combine"):
            k.moe_combine(s, x, M["down"], M["pos"], M["w"], M["shd"] if shared else 0, sg, T, H, top)
        self.tl.end(s, start)
        self.experts.finished(i, s)
        self.experts.prefetch(i + 1, T)

    def expert_gemms(self, i: int, first: int, last: int, counts, offsets, tile_start, woff: int) -> None:
        """gate, up, SiLU * up and down for the rows of experts first..last (one group); woff: the
        layer's expert address table."""
        cfg, k, s, M = self.cfg, self.k, self.s, self.ws["moe"]
        H, E, F = cfg.hidden_size, cfg.n_experts, cfg.expert_ffn
        r0, r1 = int(offsets[first]), int(offsets[last] + counts[last])
        t0, t1 = int(tile_start[first]), int(tile_start[last + 1])
        if t1 == t0:
            return                                    # a prefetched chunk that no token routed to
        tiles = M["tiles"] + t0 * 16
        flops = 2 * (r1 - r0) * F * H                 # one of gate, up, down over the group's rows
        gate, up = self.eq[(i, "ffn_gate_exps")], self.eq[(i, "ffn_up_exps")]
        with self.clock("expert gate/up", flops=2 * flops):
            if (gate.qtype, gate.row_bytes) == (up.qtype, up.row_bytes):     # one launch, SiLU fused
                k.gemm_gate_up(s, gate.qtype, x=self.ws["keep"]["xn"], ldx=H, xrows=M["tok"], y=M["g"], ldy=F,
                               woff=woff, woff_up=woff + E * 8, row_bytes=gate.row_bytes, tiles=tiles,
                               n_tiles=t1 - t0, N=F, K=H)
            else:
                for j, (w, out) in enumerate(((gate, "g"), (up, "u"))):
                    k.gemm(s, w.qtype, x=self.ws["keep"]["xn"], ldx=H, xrows=M["tok"], y=M[out], ldy=F, w=0,
                           woff=woff + j * E * 8, row_bytes=w.row_bytes, tiles=tiles, n_tiles=t1 - t0,
                           N=F, K=H)
                g, u = M["g"] + r0 * F * F32, M["u"] + r0 * F * F32
                k.silu_mul(s, g, u, g, (r1 - r0) * F)
        with self.clock("expert down", flops=flops):
            w = self.eq[(i, "ffn_down_exps")]
            k.gemm(s, w.qtype, x=M["g"], ldx=F, y=M["down"], ldy=H, w=0, woff=woff + 2 * E * 8,
                   row_bytes=w.row_bytes, tiles=tiles, n_tiles=t1 - t0, N=H, K=F)

    def shared_expert(self, i: int) -> bool:
        if not self.cfg.has_shared_expert:
            return False
        M, Fs, H = self.ws["moe"], self.cfg.shared_ffn, self.cfg.hidden_size
        xn = self.ws["keep"]["xn"]
        if self.shared_fused:
            g, table = self.w[i, "sh_gate"], self.ws["keep"]["shared_woff"] + i * 16
            self.clock.flops(2 * 2 * self.T * g.N * g.K)
            self.k.gemm_gate_up(self.s, g.qtype, x=xn, ldx=H, y=M["shg"], ldy=Fs, woff=table, woff_up=table + 8,
                                row_bytes=g.row_bytes, tiles=self.ws["keep"]["tiles"], n_tiles=-(-self.T // GEMM_BM),
                                N=Fs, K=H)
        else:
            self.dense((i, "sh_gate"), xn, H, M["shg"], Fs)
            self.dense((i, "sh_up"), xn, H, M["shu"], Fs)
            self.k.silu_mul(self.s, M["shg"], M["shu"], M["shg"], self.T * Fs)
        self.dense((i, "sh_down"), M["shg"], Fs, M["shd"], H)
        if self.layers[i]["sh_gate_inp"] is not None:
            self.dense((i, "sh_gate_inp"), xn, H, M["sg"], 1)
        return True

