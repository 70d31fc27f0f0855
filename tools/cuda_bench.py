"""Full-width benchmark of the cuda prefill backend on a synthetic model.

The model has all 40 layers at the real Qwen3.6-35B-A3B widths (hidden 2048, 256 experts
top-8 of FFN 512, shared expert 512, Gated DeltaNet 16/32 heads of 128, attention 16/2 heads
of 256, vocabulary 248320), Q4_K weights of random blocks with valid scales, built straight
in page-locked host memory. It reports, per prompt length: prompt tok/s, bytes moved to the
device and the achieved H2D rate against the pinned rate measured here, the overlap ratio
wall / max(copy, compute), peak device memory, and an estimate for a Tesla C2075.

    python tools/bench_cuda_prefill.py --budget 6GiB --prompts 947 4096 --out bench.json
    fermium bench prefill --budget 6GiB --prompt 947 --prompt 4096
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from common.model.config import ModelConfig
from common.model.gguf_file import Tensor
from common.state import SequenceState
from native.cuda.device_peak import device_peak
from native.cuda.plan import parse_size
from services.prefill.backends.cuda import CUDABackend

C2075_PCIE = 6e9          # bytes/s, pinned PCIe 2.0 x16 as the paper's card reaches
C2075_FLOPS = 1.03e12     # fp32 peak
PAPER_947_SECONDS = 37.5

QWEN36_35B = ModelConfig(
    arch="qwen35moe", vocab_size=248320, hidden_size=2048, n_layers=40, n_nextn_layers=0,
    context_length=262144, rms_eps=1e-6, n_heads=16, n_kv_heads=2, head_dim=256, rope_dim=64,
    rope_theta=1e7, full_attention_interval=4, conv_kernel=4, n_k_heads=16, n_v_heads=32,
    head_k_dim=128, head_v_dim=128, v_head_layout="tiled", n_experts=256, n_experts_used=8,
    expert_ffn=512, shared_ffn=512)


class SyntheticModel:
    """GGUFModel's interface over tensors built in memory; streamed ones are page-locked."""
    host_pinned = True

    def __init__(self, cfg: ModelConfig, cuda, qtype: Q = Q.Q4_K, seed: int = 0):
        self.config, self.path, self.tensors = cfg, Path("synthetic"), {}
        rng = np.random.default_rng(seed)
        block, size = GGML_QUANT_SIZES[qtype]
        pool = rng.integers(0, 256, size=(1 << 16, size), dtype=np.uint8)    # 16 MiB of blocks
        d = np.float16(0.02 / 150)                                          # weights ~ N(0, 0.02)
        pool[:, 0:2] = np.full((len(pool), 1), d).view(np.uint8)
        pool[:, 2:4] = np.full((len(pool), 1), np.float16(d * 7.5)).view(np.uint8)
        # scale == min in every sub-block, so each one is zero-mean (d sc (q - 7.5)): tokens stay
        # distinct through the layers and route to many experts, as in a trained model
        pool[:, 8:12] = pool[:, 4:8]
        pool[:, 12:16] = (pool[:, 12:16] & 15) * 17
        flat = pool.reshape(-1)

        def quant(name: str, shape: tuple[int, ...], pinned: bool) -> None:
            nbytes = int(np.prod(shape[:-1])) * (shape[-1] // block * size)
            raw = cuda.pagelocked_empty(nbytes, np.uint8) if pinned else np.empty(nbytes, np.uint8)
            for o in range(0, nbytes, flat.size):
                n = min(flat.size, nbytes - o)
                raw[o:o + n] = flat[:n]
            self.tensors[name] = Tensor(name, qtype, shape, raw.reshape(*shape[:-1], -1))

        def f32(name: str, value: np.ndarray) -> None:
            v = value.astype(np.float32)
            self.tensors[name] = Tensor(name, Q.F32, v.shape, v.view(np.uint8).reshape(*v.shape[:-1], -1))

        H, E, F, Fs = cfg.hidden_size, cfg.n_experts, cfg.expert_ffn, cfg.shared_ffn
        nv, dv = cfg.n_v_heads, cfg.head_v_dim
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        quant("token_embd.weight", (cfg.vocab_size, H), False)
        quant("output.weight", (cfg.vocab_size, H), True)
        f32("output_norm.weight", np.ones(H))
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            f32(p + "attn_norm.weight", np.ones(H))
            f32(p + "post_attention_norm.weight", np.ones(H))
            if cfg.is_full_attention(i):
                quant(p + "attn_q.weight", (nh * 2 * hd, H), False)
                quant(p + "attn_k.weight", (nkv * hd, H), False)
                quant(p + "attn_v.weight", (nkv * hd, H), False)
                quant(p + "attn_output.weight", (H, nh * hd), False)
                f32(p + "attn_q_norm.weight", np.ones(hd))
                f32(p + "attn_k_norm.weight", np.ones(hd))
            else:
                quant(p + "attn_qkv.weight", (cfg.conv_channels, H), False)
                quant(p + "attn_gate.weight", (nv * dv, H), False)
                quant(p + "ssm_beta.weight", (nv, H), False)
                quant(p + "ssm_alpha.weight", (nv, H), False)
                quant(p + "ssm_out.weight", (H, nv * dv), False)
                f32(p + "ssm_conv1d.weight", rng.standard_normal((cfg.conv_channels, cfg.conv_kernel)) * 0.5)
                f32(p + "ssm_a", -np.exp(rng.standard_normal(nv) * 0.5))
                f32(p + "ssm_dt.bias", rng.standard_normal(nv) * 0.5)
                f32(p + "ssm_norm.weight", np.ones(dv))
            f32(p + "ffn_gate_inp.weight", rng.standard_normal((E, H)) / np.sqrt(H))
            quant(p + "ffn_gate_exps.weight", (E, F, H), True)
            quant(p + "ffn_up_exps.weight", (E, F, H), True)
            quant(p + "ffn_down_exps.weight", (E, H, F), True)
            quant(p + "ffn_gate_shexp.weight", (Fs, H), False)
            quant(p + "ffn_up_shexp.weight", (Fs, H), False)
            quant(p + "ffn_down_shexp.weight", (H, Fs), False)
            f32(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(H) / np.sqrt(H))

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def prefill_flops(cfg: ModelConfig, T: int) -> float:
    """Multiply-adds x 2 of one prefill of T tokens from an empty state (LM head for one token)."""
    H, E, k = cfg.hidden_size, cfg.n_experts, cfg.n_experts_used
    nv, dk, dv = cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    lin = H * (cfg.conv_channels + 2 * nv * dv + 2 * nv)          # qkv, gate z, alpha, beta, out
    full = H * (nh * 2 * hd + 2 * nkv * hd) + nh * hd * H
    moe = H * E + 3 * H * cfg.expert_ffn * k + 3 * H * cfg.shared_ffn + H
    gemm = 2 * T * (len(cfg.linear_layers) * lin + len(cfg.full_layers) * full + cfg.n_layers * moe)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="6GiB")
    ap.add_argument("--prompts", type=int, nargs="+", default=[947, 4096])
    ap.add_argument("--layers", type=int, default=40, help="fewer for a quick look")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import pycuda.driver as cuda
    cuda.init()
    ctx = cuda.Device(0).make_context()
    pinned, pageable = pinned_bandwidth(cuda)
    ctx.pop()
    peak = device_peak(cuda.Device(0))
    print(f"device {cuda.Device(0).name()}: H2D pinned {pinned / 1e9:.1f} GB/s, pageable {pageable / 1e9:.1f} GB/s")
    print(peak.describe())

    cfg = QWEN36_35B if args.layers == 40 else ModelConfig(**{**QWEN36_35B.__dict__, "n_layers": args.layers})
    t = time.perf_counter()
    ctx.push()
    model = SyntheticModel(cfg, cuda)
    ctx.pop()
    print(f"synthetic model: {model.nbytes / 2**30:.2f} GiB built in {time.perf_counter() - t:.1f} s")

    longest = max(args.prompts)
    t = time.perf_counter()
    backend = CUDABackend(model, vram_budget=args.budget, pass_tokens=longest, max_context=longest)
    print(f"backend ready in {time.perf_counter() - t:.1f} s")
    rng = np.random.default_rng(1)
    backend.prefill(rng.integers(0, cfg.vocab_size, 64).tolist(), SequenceState.empty(cfg))   # warm-up

    results = {"device": cuda.Device(0).name(), "budget_bytes": parse_size(args.budget),
               "pinned_h2d_bytes_per_s": pinned, "pageable_h2d_bytes_per_s": pageable,
               "fp32_peak": peak.describe(), "fp32_peak_flops": peak.flops,
               "plan": backend.plan.describe(), "model_bytes": model.nbytes, "runs": []}
    for T in args.prompts:
        before = backend.stats()
        state = SequenceState.empty(cfg)
        logits = backend.prefill(rng.integers(0, cfg.vocab_size, T).tolist(), state)
        after = backend.stats()
        d = {k: after[k] - before[k] for k in ("h2d_bytes", "copy_seconds", "compute_seconds", "wall_seconds",
                                               "state_io_seconds", "routing_wait_seconds")}
        used = after["device_bytes_in_use"]
        flops = prefill_flops(cfg, T)
        run = {
            "tokens": T, "wall_s": d["wall_seconds"], "tok_per_s": T / d["wall_seconds"],
            "h2d_bytes": d["h2d_bytes"], "copy_s": d["copy_seconds"], "compute_s": d["compute_seconds"],
            "h2d_gb_per_s": d["h2d_bytes"] / max(d["copy_seconds"], 1e-9) / 1e9,
            "h2d_vs_pinned": d["h2d_bytes"] / max(d["copy_seconds"], 1e-9) / pinned,
            "overlap_ratio": d["wall_seconds"] / max(d["copy_seconds"], d["compute_seconds"]),
            "peak_device_bytes_counted": after["peak_device_bytes"], "device_bytes_in_use": used,
            "state_io_s": d["state_io_seconds"], "routing_wait_s": d["routing_wait_seconds"],
            "flops": flops, "achieved_tflops": flops / d["compute_seconds"] / 1e12,
            "peak_share": flops / d["compute_seconds"] / peak.flops,
            "logits_finite": bool(np.isfinite(logits).all()),
            "c2075_copy_s": d["h2d_bytes"] / C2075_PCIE, "c2075_compute_s": flops / C2075_FLOPS,
        }
        run["c2075_estimate_s"] = max(run["c2075_copy_s"], run["c2075_compute_s"])
        results["runs"].append(run)
        print(f"{T:5d} tokens: {run['wall_s']:.3f} s = {run['tok_per_s']:.0f} tok/s | "
              f"H2D {d['h2d_bytes'] / 1e9:.2f} GB in {d['copy_seconds']:.3f} s = {run['h2d_gb_per_s']:.1f} GB/s "
              f"({100 * run['h2d_vs_pinned']:.0f}% of pinned) | "
              f"compute {d['compute_seconds']:.3f} s ({run['achieved_tflops']:.1f} TFLOP/s, "
              f"{100 * run['peak_share']:.0f}% of fp32 peak) | "
              f"overlap {run['overlap_ratio']:.2f} (state I/O {d['state_io_seconds']:.3f} s, routing wait "
              f"{d['routing_wait_seconds']:.3f} s) | peak {run['peak_device_bytes_counted'] / 2**30:.2f} GiB counted, "
              f"{used / 2**30:.2f} GiB in use | C2075 est. {run['c2075_estimate_s']:.1f} s "
              f"(copy {run['c2075_copy_s']:.1f}, compute {run['c2075_compute_s']:.1f}; "
              f"paper {PAPER_947_SECONDS} s for 947)")
    backend.close()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0

