"""GEMM microbenchmark of native/cuda/gemm.cu at the 35B's shapes, against the device's fp32 peak.

Expert GEMMs (256 experts, top-8 routing of T tokens drawn at random, hidden 2048, expert FFN
512): gate/up N=512 K=2048 over gathered token rows, the fused gate+up+SiLU over the same rows
(its TFLOP/s count both GEMMs), down N=2048 K=512; and the dense projections over T rows.
Weights are random blocks with valid scales, far larger than the L2.
Every listed source is timed in the same process (CUDA events, median of --reps launches) and
checked against the first one's output, so `--source old=PATH` gives the old/new ratio.

    python tools/bench_cuda_gemm.py --tokens 947 4096 --types q4_k q5_k q6_k q8_0 q4_0 \
        --source old=/path/gemm.cu:64x64 --out gemm.json
    python tools/bench_cuda_gemm.py --tokens 4096 --types all      # every type of the registry
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from native.cuda.device_peak import device_peak  # noqa: E402
from native.cuda.kernels import (  # noqa: E402
    CUDA_DIR,
    GATE_UP_KERNELS,
    GEMM_BM,
    GEMM_BN,
    GEMM_KERNELS,
    NVCC_OPTIONS,
    SIGNATURES,
)
from tests.gpu.tiny_gguf import random_blocks  # noqa: E402

H, F, E, TOP = 2048, 512, 256, 8
SHAPES = {GEMM_BM: (GEMM_BN, "gemm_")}          # tile rows -> (block columns, kernel name prefix)
DENSE = {"qkv 8192x2048": (8192, 2048), "gate z 4096x2048": (4096, 2048), "out 2048x4096": (2048, 4096),
         "shared up 512x2048": (512, 2048), "shared down 2048x512": (2048, 512)}
CHECK_RTOL = 1e-4       # the same sums in another order, relative to the largest output
CHECK_ROWS = 2048       # output rows read back and compared per GEMM (tests/gpu checks all of them)


def random_weights(qtype: Q, n: int, rng) -> np.ndarray:
    """n weights of random blocks whose scales are small and finite."""
    block = GGML_QUANT_SIZES[qtype][0]
    return random_blocks(qtype, n // block, rng, 1e-3, 1e-2).reshape(-1)


def parse_source(spec: str) -> tuple[str, Path, dict[int, tuple[int, str]]]:
    """'name=path.cu[:64x64,32x128]' -> (name, path, tile rows -> (tile columns, prefix))."""
    name, _, rest = spec.partition("=")
    path, _, shapes = rest.partition(":")
    if not shapes:
        return name, Path(path), SHAPES
    table = {}
    for item in shapes.split(","):
        bm, bn = (int(v) for v in item.split("x"))
        table[bm] = (bn, "gemm_" if bm == 64 else f"gemm{bm}_")
    return name, Path(path), table


class Source:
    def __init__(self, cuda, name: str, path: Path, shapes):
        from pycuda.compiler import SourceModule
        self.name, self.shapes = name, shapes
        module = SourceModule(path.read_text(), options=NVCC_OPTIONS, no_extern_c=True,
                              include_dirs=[str(path.resolve().parent), str(CUDA_DIR)])
        self.fn = {}
        for qname in GEMM_KERNELS.values():
            for _, prefix in shapes.values():
                kname = qname.replace("gemm_", prefix)
                try:                                # an older source may lack the newer types
                    f = module.get_function(kname)
                except Exception:
                    continue
                f.prepare(SIGNATURES[qname])
                self.fn[kname] = f
        self.gate_up = {}                           # the fused gate/up kernels, where the source has them
        for qtype, kname in GATE_UP_KERNELS.items():
            try:
                self.gate_up[qtype] = module.get_function(kname)
            except Exception:
                continue
            self.gate_up[qtype].prepare(SIGNATURES[kname])
        self.regs = max(f.num_regs for f in [*self.fn.values(), *self.gate_up.values()])

    def has(self, qtype, bm) -> bool:
        return GEMM_KERNELS[qtype].replace("gemm_", self.shapes[bm][1]) in self.fn

    def launch(self, stream, qtype, bm, x, ldx, xrows, y, ldy, w, woff, row_bytes, tiles, n_tiles, N, K):
        bn, prefix = self.shapes[bm]
        self.fn[GEMM_KERNELS[qtype].replace("gemm_", prefix)].prepared_async_call(
            (-(-N // bn), n_tiles, 1), (256, 1, 1), stream, x, ldx, xrows, y, ldy, 0, w, woff, row_bytes,
            tiles, N, K)

    def launch_gate_up(self, stream, qtype, x, ldx, xrows, y, ldy, woff, woff_up, row_bytes, tiles, n_tiles, N, K):
        self.gate_up[qtype].prepared_async_call((-(-N // (GEMM_BN // 2)), n_tiles, 1), (256, 1, 1), stream,
                                                x, ldx, xrows, y, ldy, 0, woff, woff_up, row_bytes, tiles, N, K)


def expert_tiles(T: int, bm: int, rng) -> tuple[np.ndarray, np.ndarray, int]:
    """(tiles [n, 4], token of each routed row, rows): top-8 distinct experts per token, grouped."""
    ids = np.argsort(rng.random((T, E)), axis=1)[:, :TOP]
    order = np.argsort(ids.reshape(-1), kind="stable")
    tok = (order // TOP).astype(np.int32)
    counts = np.bincount(ids.reshape(-1), minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    tiles = [(e, offsets[e] + r, min(bm, counts[e] - r), 0) for e in range(E) for r in range(0, counts[e], bm)]
    return np.array(tiles, np.int32), tok, T * TOP


def dense_tiles(T: int, bm: int) -> np.ndarray:
    return np.array([(0, r, min(bm, T - r), 0) for r in range(0, T, bm)], np.int32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[947, 4096])
    ap.add_argument("--types", nargs="+", default=["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
    ap.add_argument("--source", action="append", default=[],
                    help="more sources to time, name=path.cu[:BMxBN,...] (the shapes of its kernels)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.types == ["all"]:
        args.types = [q.name.lower() for q in GEMM_KERNELS if q not in (Q.F32, Q.F16, Q.BF16)]

    import pycuda.driver as cuda
    cuda.init()
    dev = cuda.Device(0)
    ctx = dev.make_context()
    try:
        peak = device_peak(dev)
        print(peak.describe())
        sources = [Source(cuda, "new", CUDA_DIR / "gemm.cu", SHAPES)]
        sources += [Source(cuda, *parse_source(s)) for s in args.source]
        for s in sources:
            print(f"source {s.name}: tile shapes {s.shapes}, at most {s.regs} registers per thread")
        rows = run_all(cuda, args, sources, peak.flops)
    finally:
        ctx.pop()
        ctx.detach()
    names = [s.name for s in sources]
    print(f"\n{'type':6s} {'GEMM':26s} {'T':>5s} {'bm':>3s} " + " ".join(f"{n + ' TF/s':>10s}" for n in names)
          + f" {'% peak':>7s}" + "".join(f" {'new/' + n:>9s}" for n in names[1:]) + "  max rel diff")
    for r in rows:
        tf = [r["tflops"].get(n, float("nan")) for n in names]           # nan: a source without that kernel
        print(f"{r['type']:6s} {r['gemm']:26s} {r['tokens']:5d} {r['bm']:3d} " + " ".join(f"{v:10.2f}" for v in tf)
              + f" {100 * r['peak_share']['new']:6.1f}%" + "".join(f" {tf[0] / v:9.2f}" for v in tf[1:])
              + f"  {max(r['rel_diff'].values(), default=0):.1e}")
    if args.out:
        args.out.write_text(json.dumps({"peak": peak.describe(), "peak_flops": peak.flops,
                                        "sources": {s.name: {"shapes": s.shapes, "regs": s.regs} for s in sources},
                                        "rows": rows}, indent=2))
    bad = [r for r in rows if max(r["rel_diff"].values(), default=0) > CHECK_RTOL]
    return 1 if bad else 0


def run_all(cuda, args, sources, peak_flops: float) -> list[dict]:
    rng = np.random.default_rng(0)
    stream = cuda.Stream()
    start, stop = cuda.Event(), cuda.Event()
    Tmax = max(args.tokens)
    bufs = []

    def put(a):
        mem = cuda.mem_alloc(max(a.nbytes, 4))
        cuda.memcpy_htod(mem, np.ascontiguousarray(a))
        bufs.append(mem)
        return int(mem)

    x = put(rng.standard_normal((Tmax * TOP, max(H, 4096)), dtype=np.float32))   # also the down GEMM's input
    ymem = cuda.mem_alloc(Tmax * TOP * H * 4)
    y = int(ymem)
    results = []

    def time(go):
        for _ in range(2):
            go()
        times = []
        for _ in range(args.reps):
            start.record(stream)
            go()
            stop.record(stream)
            stop.synchronize()
            times.append(stop.time_since(start) / 1e3)
        return float(np.median(times))

    def measure(qtype, gemm, T, bm, flops, nout, ldy, launch_args, fused=False):
        row = {"type": qtype.name.lower(), "gemm": gemm, "tokens": T, "bm": bm, "flops": flops,
               "seconds": {}, "tflops": {}, "peak_share": {}, "rel_diff": {}}
        ref = None
        for src in sources:
            if (qtype not in src.gate_up) if fused else (bm not in src.shapes or not src.has(qtype, bm)):
                continue
            go = (lambda: src.launch_gate_up(stream, qtype, *launch_args)) if fused else \
                (lambda: src.launch(stream, qtype, bm, *launch_args))
            cuda.memset_d32(y, 0x7fc00000, nout * ldy)                 # NaN: every output must be written
            go()
            stream.synchronize()
            out = np.empty((min(nout, CHECK_ROWS), ldy), np.float32)
            cuda.memcpy_dtoh(out, y)
            if ref is None:
                ref = out
            else:
                row["rel_diff"][src.name] = float(np.nan_to_num(np.max(np.abs(out - ref)), nan=np.inf)
                                                  / np.max(np.abs(ref)))
            if not np.isfinite(out).all():
                row["rel_diff"][src.name + " unwritten"] = float("inf")
            sec = time(go)
            row["seconds"][src.name] = sec
            row["tflops"][src.name] = flops / sec / 1e12
            row["peak_share"][src.name] = flops / sec / peak_flops
        results.append(row)
        print(f"{row['type']:6s} {gemm:26s} T={T:5d} bm={bm:2d} " +
              " ".join(f"{n} {v:.2f}" for n, v in row["tflops"].items()) + " TFLOP/s", flush=True)

    for name in args.types:
        qtype = Q[name.upper()]
        block, size = GGML_QUANT_SIZES[qtype]
        raw = random_weights(qtype, E * F * H, rng)
        w = put(raw)
        w_up = put(random_weights(qtype, E * F * H, np.random.default_rng(1)))  # the fused kernel's up rows
        for T in args.tokens:
            for bm in sorted(sources[0].shapes):
                tiles_h, tok, n = expert_tiles(T, bm, np.random.default_rng(T))
                tiles, xrows = put(tiles_h), put(tok)
                for gemm, N, K, gather in (("experts gate/up 512x2048", F, H, True),
                                           ("experts down 2048x512", H, F, False)):
                    rb = K // block * size
                    woff = put((w + np.arange(E) * N * rb).astype(np.int64))
                    measure(qtype, gemm, T, bm, 2.0 * n * N * K, n, N,
                            (x, K, xrows if gather else 0, y, N, 0, woff, rb, tiles, len(tiles_h), N, K))
                rb = H // block * size
                woff, woff_up = (put((base + np.arange(E) * F * rb).astype(np.int64)) for base in (w, w_up))
                measure(qtype, "experts fused gate/up 2x512x2048", T, bm, 4.0 * n * F * H, n, F,
                        (x, H, xrows, y, F, woff, woff_up, rb, tiles, len(tiles_h), F, H), fused=True)
            for gemm, (N, K) in DENSE.items():
                rb = K // block * size
                tiles_h = dense_tiles(T, 64)
                measure(qtype, "dense " + gemm, T, 64, 2.0 * T * N * K, T, N,
                        (x, K, 0, y, N, w, 0, rb, put(tiles_h), len(tiles_h), N, K))
        for mem in bufs[1:]:
            mem.free()
        del bufs[1:]
    ymem.free()
    bufs[0].free()
    return results


if __name__ == "__main__":
    sys.exit(main())
