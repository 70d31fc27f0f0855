"""The row kernels' streaming speed per weight type against the measured read bandwidth: a random
matrix of about 64 MB of each type (two copies, read in turn, so that the last-level cache keeps
neither; in 2 MB pages), one activation row, on a pool of THREADS. Round by round every type runs ITERS matvecs
and then the bandwidth is measured (the faster of the plain and the prefetched stream, chosen
once, as `fermium bench` does), so all types see the same load on the machine; the medians over
the rounds are printed. Repacked layouts are named as in native/cpu (Q4_0P, Q4_0X8, ...).

    python tools/stream_types.py --isa avx2 --threads 2 Q4_0 Q4_0X8 Q4_1 Q5_0 Q5_1 IQ4_NL MXFP4
"""
from __future__ import annotations

import argparse
import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.model.huge_pages import advise_huge_pages  # noqa: E402
from native import cpu_lib  # noqa: E402
from native.cpu_lib import lib, ptr  # noqa: E402
from tools.synthetic_blocks import MAKERS  # noqa: E402

COLS = 4096


def in_huge_pages(a: np.ndarray) -> np.ndarray:
    """A copy of a in an anonymous mapping advised to 2 MB pages, as the weights are mapped (and the
    bandwidth buffer asks for): in 4 KB pages a stream takes a TLB miss every 4 KB."""
    mm = mmap.mmap(-1, a.nbytes)
    advise_huge_pages(mm)
    out = np.frombuffer(mm, np.uint8, a.nbytes).reshape(a.shape)
    out[...] = a
    return out


def matrices(name: str, mb: int, rng) -> tuple[int, list[np.ndarray]]:
    """(type id as the kernels know it, two (rows, row_bytes) copies of about `mb` MB)."""
    layout = getattr(lib, f"FM_{name}", None)
    source = T(cpu_lib.LAYOUTS[layout]) if layout is not None else T[name]
    row_bytes = COLS // lib.fm_type_block(int(source)) * lib.fm_type_block_bytes(int(source))
    rows = (mb << 20) // row_bytes // 8 * 8   # whole groups of repacked rows
    out = []
    for _ in range(2):
        w = MAKERS[source](rng, rows, COLS, 0.02).reshape(rows, row_bytes)
        out.append(in_huge_pages(cpu_lib.repack(layout, w, COLS) if layout is not None else w))
    return (layout if layout is not None else int(source)), out


def timed(pool: cpu_lib.Pool, qtype: int, w: np.ndarray, x: np.ndarray, y: np.ndarray, clock=time.perf_counter,
          reps: int = 1) -> float:
    t0 = clock()
    for _ in range(reps):
        lib.fm_matvec(pool.ptr, qtype, ptr(w), w.shape[1], w.shape[0], COLS, 1, ptr(x, "float *"), ptr(y, "float *"))
    return reps * w.nbytes / (clock() - t0)


def compute_bound(mats: dict, pool: cpu_lib.Pool, x: np.ndarray, y: np.ndarray, rounds: int) -> None:
    """Each kernel on a matrix its core's caches hold (--mb 1), timed by the CPU time of the
    process: the rate its instructions allow, which the memory's pace needs, undisturbed by
    other programs that share the cores."""
    print(f"isa {cpu_lib.active_isa()}, {pool.threads} thread(s), cache-resident, GB/s per second of CPU time")
    for name, (qtype, ws) in mats.items():
        rates = [timed(pool, qtype, ws[0], x, y, time.process_time, 200) / 1e9 for _ in range(rounds)]
        print(f"{name:>8s}: {statistics.median(rates):6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("types", nargs="+", help="GGUF type names or repacked layouts (Q4_0P, Q4_0X8, ...)")
    ap.add_argument("--isa", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=int, default=64, help="MB of each copy of a matrix")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=8, help="matvecs per type and round")
    ap.add_argument("--compute", action="store_true", help="cache-resident rates by CPU time (compute_bound)")
    args = ap.parse_args()
    if args.isa:
        cpu_lib.select_isa(args.isa)
    rng = np.random.default_rng(0)
    pool = cpu_lib.Pool(args.threads)
    mats = {name: matrices(name, args.mb, rng) for name in args.types}
    x = rng.standard_normal(COLS).astype(np.float32)
    y = np.empty(max(m[0].shape[0] for _, m in mats.values()), np.float32)
    if args.compute:
        compute_bound(mats, pool, x, y, args.rounds)
        return
    probe = cpu_lib.MemBandwidth(pool, 1 << 30)
    prefetch = probe.faster_stream()
    speed: dict[str, list[float]] = {name: [] for name in mats}
    share: dict[str, list[float]] = {name: [] for name in mats}
    for _ in range(args.rounds):
        for name, (qtype, ws) in mats.items():
            timed(pool, qtype, ws[1], x, y)   # warm the pool and the pages
            gbs = statistics.median(timed(pool, qtype, ws[k % 2], x, y) for k in range(args.iters))
            bw = probe.stream(prefetch)
            speed[name].append(gbs / 1e9)
            share[name].append(gbs / bw)
    bws = [s / r for name in mats for s, r in zip(speed[name], share[name])]
    print(f"isa {cpu_lib.active_isa()}, {args.threads} threads, {args.mb} MB x 2 per type, {COLS} columns, "
          f"bandwidth {statistics.median(bws):.2f} GB/s ({'prefetched' if prefetch else 'plain'} stream)")
    base = statistics.median(speed[args.types[0]])
    for name in mats:
        s = statistics.median(speed[name])
        print(f"{name:>8s}: {s:6.2f} GB/s of weights, {statistics.median(share[name]):.3f} of the bandwidth, "
              f"{s / base:.2f}x {args.types[0]}")


if __name__ == "__main__":
    main()
