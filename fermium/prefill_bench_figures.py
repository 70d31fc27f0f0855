"""The figures of `fermium bench prefill`: FLOPs of a prefill, the host-to-device rates, and one
timed prompt turned into its report (rates, overlap, share of fp32 peak, the C2075 estimate, and
with phases on, its phase table: native/cuda/phases.py).
"""
from __future__ import annotations

import numpy as np

from common.model.config import ModelConfig
from common.state import SequenceState

C2075_PCIE = 6e9          # bytes/s, pinned PCIe 2.0 x16 as the paper's card reaches
C2075_FLOPS = 1.03e12     # fp32 peak
PAPER_947_SECONDS = 37.5
DELTAS = ("h2d_bytes", "copy_seconds", "compute_seconds", "wall_seconds", "state_io_seconds",
          "routing_wait_seconds")


def prefill_flops(cfg: ModelConfig, T: int) -> float:
    """Multiply-adds x 2 of one prefill of T tokens from an empty state (LM head for one token)."""
    H, E, k = cfg.hidden_size, cfg.n_experts, cfg.n_experts_used
    nv, dk, dv = cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lin = H * (cfg.conv_channels + 2 * nv * dv + 2 * nv)          # qkv, gate z, alpha, beta, out
    full = H * (nh * 2 * hd + 2 * nkv * hd) + nh * hd * H
    # the MoE (router, routed and shared experts, the shared gate), or the dense FFN: the other terms are 0
    ffn = (H * E + 3 * H * cfg.expert_ffn * k + 3 * H * cfg.shared_ffn + (H if cfg.has_shared_expert else 0)
           + 3 * H * cfg.dense_ffn)
    gemm = 2 * T * (len(cfg.linear_layers) * lin + len(cfg.full_layers) * full + cfg.n_layers * ffn)
    attn = len(cfg.full_layers) * nh * 2 * hd * 2 * (T * (T + 1) / 2)
    c = 64                                                          # chunked delta rule per token and head
    scan = len(cfg.linear_layers) * T * nv * 2 * (c * (dk + dk + dv + dk) + 3 * dk * dv + c * dv)
    return gemm + attn + scan + 2 * H * cfg.vocab_size


def pinned_bandwidth(cuda, nbytes: int = 1 << 30) -> tuple[float, float]:
    """(pinned, pageable) host-to-device bytes/s."""
    dst = cuda.mem_alloc(nbytes)
    rates = []
    for src in (cuda.pagelocked_empty(nbytes, np.uint8), np.ones(nbytes, np.uint8)):
        src[:] = 1
        s, a, b = cuda.Stream(), cuda.Event(), cuda.Event()
        cuda.memcpy_htod_async(dst, src, s)
        s.synchronize()
        a.record(s)
        for _ in range(3):
            cuda.memcpy_htod_async(dst, src, s)
        b.record(s)
        s.synchronize()
        rates.append(3 * nbytes / (b.time_since(a) / 1e3))
    dst.free()
    return rates[0], rates[1]


def timed_run(backend, cfg: ModelConfig, tokens: list[int], pinned: float, peak) -> dict:
    """Prefill `tokens` from an empty state and report it (peak: a device_peak.Fp32Peak)."""
    T = len(tokens)
    before = backend.stats()
    logits = backend.prefill(tokens, SequenceState.empty(cfg))
    after = backend.stats()
    d = {k: after[k] - before[k] for k in DELTAS}
    flops = prefill_flops(cfg, T)
    rate = d["h2d_bytes"] / max(d["copy_seconds"], 1e-9)
    compute = max(d["compute_seconds"], 1e-9)
    run = {
        "tokens": T, "wall_s": d["wall_seconds"], "tok_per_s": T / d["wall_seconds"],
        "h2d_bytes": d["h2d_bytes"], "copy_s": d["copy_seconds"], "compute_s": d["compute_seconds"],
        "h2d_gb_per_s": rate / 1e9, "h2d_vs_pinned": rate / pinned,
        "overlap_ratio": d["wall_seconds"] / max(d["copy_seconds"], compute),
        "peak_device_bytes_counted": after["peak_device_bytes"], "device_bytes_in_use": after["device_bytes_in_use"],
        "state_io_s": d["state_io_seconds"], "routing_wait_s": d["routing_wait_seconds"],
        "flops": flops, "achieved_tflops": flops / compute / 1e12, "peak_share": flops / compute / peak.flops,
        "logits_finite": bool(np.isfinite(logits).all()),
        "c2075_copy_s": d["h2d_bytes"] / C2075_PCIE, "c2075_compute_s": flops / C2075_FLOPS,
    }
    run["c2075_estimate_s"] = max(run["c2075_copy_s"], run["c2075_compute_s"])
    if getattr(backend, "last_phases", None):          # the backend made with phases=True
        run["phases"] = backend.last_phases
    return run


def run_line(run: dict) -> str:
    return (f"{run['tokens']:5d} tokens: {run['wall_s']:.3f} s = {run['tok_per_s']:.0f} tok/s | "
            f"H2D {run['h2d_bytes'] / 1e9:.2f} GB in {run['copy_s']:.3f} s = {run['h2d_gb_per_s']:.1f} GB/s "
            f"({100 * run['h2d_vs_pinned']:.0f}% of pinned) | "
            f"compute {run['compute_s']:.3f} s ({run['achieved_tflops']:.1f} TFLOP/s, "
            f"{100 * run['peak_share']:.0f}% of fp32 peak) | "
            f"overlap {run['overlap_ratio']:.2f} (state I/O {run['state_io_s']:.3f} s, routing wait "
            f"{run['routing_wait_s']:.3f} s) | peak {run['peak_device_bytes_counted'] / 2**30:.2f} GiB counted, "
            f"{run['device_bytes_in_use'] / 2**30:.2f} GiB in use | C2075 est. {run['c2075_estimate_s']:.1f} s "
            f"(copy {run['c2075_copy_s']:.1f}, compute {run['c2075_compute_s']:.1f}; "
            f"paper {PAPER_947_SECONDS} s for 947)")
