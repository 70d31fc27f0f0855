"""Full-width benchmark of the cuda prefill backend, on a synthetic model or on a GGUF file.

Without --model, the model has all 40 layers at the real Qwen3.6-35B-A3B widths in Q4_K
(fermium/prefill_bench_synthetic.py), built straight in page-locked host memory. With --model, the
backend runs that qwen35moe (or qwen35) file as serving does: the file mapped, its streamed experts staged
into page-locked host memory (`--staging auto|register|copy`, native/cuda/staging.py), whose
cost is reported; --compare-staging stages them again both ways and gives the ratio. Prompts
are random token ids below the vocabulary, from a fixed seed. It reports, per prompt length:
prompt tok/s, bytes moved to the device and the achieved H2D rate against the pinned rate
measured here, the overlap ratio wall / max(copy, compute), achieved TFLOP/s against the
device's fp32 peak (native/cuda/device_peak.py), peak device memory, and an estimate for a
Tesla C2075 (fermium/prefill_bench_figures.py). With --phases, each prompt's compute span is split
into the phases of its layers (native/cuda/phases.py): seconds, share, calls, TFLOP/s of GEMMs.

    python tools/bench_cuda_prefill.py --budget 6GiB --prompts 947 4096 --out bench.json
    fermium bench prefill --budget 6GiB --prompt 947 --prompt 4096
    fermium bench prefill --model Qwen3.6-35B-A3B-Q4_K_M.gguf --compare-staging
    fermium bench prefill --model Qwen3.6-35B-A3B-Q4_K_M.gguf --prompt 4096 --phases
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from common.model.config import ModelConfig
from common.state import SequenceState
from fermium.prefill_bench_figures import pinned_bandwidth, run_line, timed_run
from fermium.prefill_bench_file import (
    BenchModelError,
    compare_lines,
    compare_staging,
    open_model,
    staging_figures,
    staging_line,
)
from fermium.prefill_bench_synthetic import QWEN36_35B, SyntheticModel
from native.cuda.device_peak import device_peak
from native.cuda.phases import phase_lines
from native.cuda.plan import parse_size
from native.cuda.staging import STAGINGS
from services.prefill.backends import cuda as cuda_backend

SEED = 1


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="6GiB")
    ap.add_argument("--prompts", type=int, nargs="+", default=[947, 4096])
    ap.add_argument("--model", type=Path, help="a qwen35moe GGUF file; the synthetic model without it")
    ap.add_argument("--layers", type=int, help="layers of the synthetic model (40, the real depth, unless set)")
    ap.add_argument("--staging", choices=STAGINGS, default="auto", help="how the streamed experts are staged")
    ap.add_argument("--compare-staging", action="store_true", help="time staging by copy and by register too")
    ap.add_argument("--phases", action="store_true", help="time each phase of each layer with CUDA events")
    ap.add_argument("--bandwidth-bytes", type=int, default=1 << 30, help="bytes per H2D rate measurement")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    return ap.parse_args(argv)


def fail(message: str) -> int:
    print(f"fermium bench prefill: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse(argv)
    if args.model and args.layers:
        return fail("--layers applies to the synthetic model only, not with --model")
    if args.compare_staging and not args.model:
        return fail("--compare-staging needs --model (the synthetic model is built in page-locked memory)")
    try:
        model = open_model(args.model) if args.model else None
    except BenchModelError as exc:
        return fail(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    cuda = cuda_backend._driver()
    ctx = cuda.Device(0).make_context()
    pinned, pageable = pinned_bandwidth(cuda, args.bandwidth_bytes)
    ctx.pop()
    peak = device_peak(cuda.Device(0))
    print(f"device {cuda.Device(0).name()}: H2D pinned {pinned / 1e9:.1f} GB/s, pageable {pageable / 1e9:.1f} GB/s")
    print(peak.describe())

    t = time.perf_counter()
    if model is None:
        layers = args.layers or QWEN36_35B.n_layers
        cfg = ModelConfig(**{**QWEN36_35B.__dict__, "n_layers": layers})
        ctx.push()
        model = SyntheticModel(cfg, cuda)
        ctx.pop()
        print(f"synthetic model: {model.nbytes / 2**30:.2f} GiB built in {time.perf_counter() - t:.1f} s")
    else:
        cfg = model.config
        print(f"model {model.path}: {model.nbytes / 2**30:.2f} GiB, {cfg.n_layers} layers, "
              + (f"{cfg.n_experts} experts of {cfg.expert_ffn}" if cfg.n_experts else f"a dense FFN of {cfg.dense_ffn}")
              + f", vocabulary {cfg.vocab_size}")

    longest = max(args.prompts)
    t = time.perf_counter()
    backend = cuda_backend.CUDABackend(model, vram_budget=args.budget, pass_tokens=longest, max_context=longest,
                                       staging=args.staging, phases=args.phases)
    print(f"backend ready in {time.perf_counter() - t:.1f} s")
    staging = staging_figures(backend.host)
    print(staging_line("staging", staging))
    rng = np.random.default_rng(SEED)
    backend.prefill(rng.integers(0, cfg.vocab_size, min(64, longest)).tolist(), SequenceState.empty(cfg))  # warm-up

    results = {"device": cuda.Device(0).name(), "model": str(model.path), "budget_bytes": parse_size(args.budget),
               "pinned_h2d_bytes_per_s": pinned, "pageable_h2d_bytes_per_s": pageable,
               "fp32_peak": peak.describe(), "fp32_peak_flops": peak.flops,
               "plan": backend.plan.describe(), "model_bytes": model.nbytes, "staging": staging, "runs": []}
    for T in args.prompts:
        run = timed_run(backend, cfg, rng.integers(0, cfg.vocab_size, T).tolist(), pinned, peak)
        results["runs"].append(run)
        print(run_line(run))
        if "phases" in run:
            print("\n".join(phase_lines(run["phases"])))
    if args.compare_staging:
        results["staging_compared"] = cmp = compare_staging(cuda, backend, model)
        for line in compare_lines(cmp):
            print(line)
    backend.close()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0
