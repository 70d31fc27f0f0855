"""The matvec of a random matrix of each weight type (about 64 MB, past the last-level cache) per
ISA on a pool of THREADS, against the read bandwidth measured on the same pool in the same run:
GB/s of weights read, and their share of the bandwidth. Kernel and bandwidth passes alternate,
and each figure is the best of REPS, so that a drift of the machine touches both alike.

    python tools/bench_matvec_types.py --types IQ2_XXS,IQ2_XS,IQ2_S,Q4_K --isas ssse3,avx2 --threads 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from native import cpu_lib  # noqa: E402
from native.cpu_lib import lib, ptr  # noqa: E402
from tools.synthetic_blocks import MAKERS  # noqa: E402

COLS = 4096


def matvec_gbs(pool: cpu_lib.Pool, qtype: T, w: np.ndarray, x: np.ndarray, y: np.ndarray, iters: int) -> float:
    """Weight bytes per second of the best of `iters` matvecs."""
    best = 0.0
    for _ in range(iters):
        t0 = time.perf_counter()
        lib.fm_matvec(pool.ptr, int(qtype), ptr(w), w.shape[1], w.shape[0], COLS, 1, ptr(x, "float *"),
                      ptr(y, "float *"))
        best = max(best, w.nbytes / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="IQ2_XXS,IQ2_XS,IQ2_S,Q4_K")
    ap.add_argument("--isas", default="ssse3,avx2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=int, default=64, help="matrix size in MB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=4, help="matvecs per pass")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    pool = cpu_lib.Pool(args.threads)
    probe = cpu_lib.MemBandwidth(pool, args.mb << 20)
    prefetch = probe.faster_stream()
    x = rng.standard_normal((1, COLS)).astype(np.float32)
    isas = [i for i in args.isas.split(",") if i in cpu_lib.supported_isas()]
    print(f"{args.threads} threads, {args.mb} MB matrices of {COLS} columns, best of {args.reps} passes; "
          f"bandwidth: {'prefetched' if prefetch else 'plain'} stream")
    for name in args.types.split(","):
        qtype = T[name]
        w = MAKERS[qtype](rng, 1, COLS, 0.02)
        rows = (args.mb << 20) // w.nbytes
        w = np.ascontiguousarray(MAKERS[qtype](rng, rows, COLS, 0.02).reshape(rows, -1))
        y = np.empty(rows, np.float32)
        kernel, stream = dict.fromkeys(isas, 0.0), 0.0
        for _ in range(args.reps):
            for isa in isas:
                cpu_lib.select_isa(isa)
                kernel[isa] = max(kernel[isa], matvec_gbs(pool, qtype, w, x, y, args.iters))
            stream = max(stream, probe.stream(prefetch))
        for isa in isas:
            print(f"{name:8s} {isa:7s} {kernel[isa] / 1e9:6.2f} GB/s of {stream / 1e9:6.2f}: "
                  f"{kernel[isa] / stream:5.1%}")


if __name__ == "__main__":
    main()
