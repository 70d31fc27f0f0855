"""Fermium against llama.cpp weight type by weight type: one command, one table.

    python tools/vs_llama_types.py --types q4_k_m q2_k iq4_xs ... [--llama-cpp DEST] [--models DIR]
                                   [--out DIR] [--threads 2] [--layers 4] [--reps 3] [--tokens 16]
                                   [--depths 0 8192] [--prompts 4096] [--avx2-depths D ...]
                                   [--avx2-prompts P ...] [--ssse3-depths 0] [--ssse3-prompts P ...]
                                   [--kv-type f16] [--max-busy C] [--timeout S]

For each type T, the real-width file of --layers layers (tools/make_synthetic_gguf.py --type T,
written once into --models), then tools/vs_llama_bench.py's points on it, each engine's runs
alternated with the other's: decode after each of --depths and a prefill of each of --prompts
against llama-bench built for this CPU, the points of --avx2-depths and --avx2-prompts with
Fermium's --isa avx2 against llama.cpp's AVX2 build, and those of --ssse3-depths and --ssse3-prompts
with Fermium's --isa ssse3 against llama.cpp's SSE4.2 build. The builds are made in DEST's tree by
tools/fetch_llama_cpp.sh (--build cpu, avx2 and sse42; nothing is rebuilt that is there; the
logs go to OUT/llama-build-*.log). A type that cannot be written or run gives a row saying why,
and the others go on.

The table is printed and written to OUT/table.md; OUT/results.json holds every run, rewritten after
each point, so a long run that is stopped keeps what it measured. Per type and point: the medians
of Fermium's and llama.cpp's tok/s and the median of the pairs' ratios; at depth 0, both engines'
share of the memory bandwidth that Fermium's run measured (native/cpu/membw.c): Fermium's from its
report, llama.cpp's its tok/s times Fermium's weight bytes per step over that bandwidth (both read
the same weights per token).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import vs_llama_bench as vb  # noqa: E402

# our side -> (tools/fetch_llama_cpp.sh --build, Fermium's --isa: None is the fastest this CPU runs)
SIDES = {"native": ("cpu", None), "avx2": ("avx2", "avx2"), "ssse3": ("sse42", "ssse3")}


def llama_bench(dest: Path, build: str, log: Path) -> Path:
    with open(log, "w") as err:
        out = subprocess.run(["bash", str(ROOT / "tools" / "fetch_llama_cpp.sh"), str(dest), "--build", build],
                             stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        sys.exit(f"tools/fetch_llama_cpp.sh {dest} --build {build} failed; see {log}")
    return Path(out.stdout.split()[-1], f"build-{build}", "bin", "llama-bench")


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "unknown")


def synthetic(kind: str, layers: int, models: Path) -> Path:
    """The real-width file of `layers` layers of weight type `kind`, written once."""
    path = models / f"syn-{kind}-L{layers}.gguf"
    if not path.is_file():
        part = path.with_suffix(".part")
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "make_synthetic_gguf.py"), str(part),
                              "--type", kind, "--layers", str(layers)], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            part.unlink(missing_ok=True)
            raise vb.RunFailed(f"make_synthetic_gguf.py --type {kind} exited {out.returncode}: "
                               f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
        part.rename(path)
    return path


def shares(point: vb.Point) -> tuple[float | None, float | None]:
    """Fermium's and llama.cpp's median shares of the bandwidth Fermium measured, at depth 0."""
    extra = [e for e in point.fermium_extra if "membw_gbs" in e]
    if point.kind != "depth" or point.size != 0 or not extra:
        return None, None
    theirs = [lc * e["gb_per_step"] / e["membw_gbs"] for lc, e in zip(point.llama_tok_s, extra)]
    return statistics.median(e["median_bw_ratio"] for e in extra), statistics.median(theirs)


def row(kind: str, side: str, gb: float | None, point: vb.Point | None, error: str | None = None,
        isa: str | None = None) -> dict:
    out = {"type": kind, "side": f"{side} ({isa})" if isa and isa != side else side, "file_gb": gb, "error": error}
    if point is not None:
        fm_share, lc_share = shares(point)
        out.update(point=asdict(point), **point.summary(), fermium_bw_share=fm_share, llama_bw_share=lc_share,
                   error=point.error)
    return out


def _why(error: str) -> str:
    """One line of a failure for the table (results.json has all of it): its last line that names
    an error, an assertion or a failure, else its first."""
    lines = [x.strip() for x in error.splitlines() if x.strip()]
    named = [x for x in lines if any(w in x.lower() for w in ("error", "assert", "fail"))]
    return (named or lines or ["failed"])[-1 if named else 0][:200].replace("|", "/")


def _cell(r: dict) -> str:
    if not r.get("pairs"):
        why = _why(r["error"]) if r["error"] else "no quiet pair"
        return f"| {r['type']} | {r['side']} | {r.get('label', '')} | {why} | | | |"
    bw = (f"{100 * r['fermium_bw_share']:.0f}% / {100 * r['llama_bw_share']:.0f}%"
          if r["fermium_bw_share"] is not None else "")
    return (f"| {r['type']} | {r['side']} | {r['label']} | {r['fermium_median']:.2f} | {r['llama_median']:.2f} | "
            f"{r['ratio']:.2f}x | {bw} |")


def table(rows: list[dict], header: list[str]) -> str:
    return "\n".join([*header, "", "| type | Fermium side | point | Fermium tok/s | llama.cpp tok/s | Fermium / "
                      "llama.cpp | bandwidth share at depth 0, Fermium / llama.cpp |", "|---|---|---|---|---|---|---|",
                      *(_cell(r) for r in rows)]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", required=True, help="tools/make_synthetic_gguf.py --type values")
    p.add_argument("--llama-cpp", type=Path, default=ROOT / ".cache" / "llama-cpp",
                   help="tools/fetch_llama_cpp.sh's DEST: where it fetches llama.cpp, or a llama.cpp tree")
    p.add_argument("--models", type=Path, default=Path("/tmp/fermium-models"))
    p.add_argument("--out", type=Path, default=Path("/tmp/fermium-vs-llama"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=3, help="pairs of runs per point")
    p.add_argument("--tokens", type=int, default=16, help="decode steps timed per run, both engines")
    p.add_argument("--depths", type=int, nargs="*", default=[0, 8192])
    p.add_argument("--prompts", type=int, nargs="*", default=[4096])
    p.add_argument("--avx2-depths", type=int, nargs="*", default=[],
                   help="decode depths of Fermium's --isa avx2 against llama.cpp's AVX2 build")
    p.add_argument("--avx2-prompts", type=int, nargs="*", default=[])
    p.add_argument("--ssse3-depths", type=int, nargs="*", default=[0])
    p.add_argument("--ssse3-prompts", type=int, nargs="*", default=[])
    p.add_argument("--kv-type", default="f16", choices=["f16", "q8_0", "f32"])
    p.add_argument("--timeout", type=float, help="seconds one run may take before its point is given up")
    p.add_argument("--max-busy", type=float, help="as tools/vs_llama_bench.py --max-busy")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.models.mkdir(parents=True, exist_ok=True)
    points_of = {"native": (a.depths, a.prompts), "avx2": (a.avx2_depths, a.avx2_prompts),
                 "ssse3": (a.ssse3_depths, a.ssse3_prompts)}
    sides = [s for s in SIDES if any(points_of[s])]
    benches = {s: llama_bench(a.llama_cpp, SIDES[s][0], a.out / f"llama-build-{SIDES[s][0]}.log") for s in sides}
    kv_flag = ["--kv-type", a.kv_type] if vb.fermium_has_kv_type() else []
    header = [f"$ python {shlex.join(['tools/vs_llama_types.py', *sys.argv[1:]])}", f"cpu: {cpu_model()}",
              *(f"llama-bench ({s}): {vb.llama_version(b)}" for s, b in benches.items()),
              f"threads {a.threads}, {a.layers}-layer real-width files, {a.reps} pairs per point, "
              f"{a.tokens} decode steps per run, KV {a.kv_type}" + ("" if kv_flag else " (Fermium: f32)")]
    print("\n".join(header), flush=True)
    rows: list[dict] = []
    for kind in a.types:
        try:
            model = synthetic(kind, a.layers, a.models)
        except vb.RunFailed as exc:
            print(f"{kind}: {exc}", flush=True)
            rows.append(row(kind, "", None, None, str(exc)))
            continue
        gb = model.stat().st_size / 1e9
        for side in sides:
            depths, prompts = points_of[side]
            ns = argparse.Namespace(llama_bench=benches[side], model=model, threads=a.threads, prompts=prompts,
                                    depths=depths, reps=a.reps, tokens=a.tokens, kv_type=a.kv_type,
                                    isa=SIDES[side][1], timeout=a.timeout, max_busy=a.max_busy)
            build = {"fermium_kv_type": a.kv_type if kv_flag else "f32"}
            for point in vb.build_points(ns, kv_flag):
                print(f"{kind} {side} {point.label}:\n  $ {shlex.join(point.llama_cmd)}\n"
                      f"  $ {shlex.join(point.fermium_cmd)}", flush=True)
                vb.measure(point, ns, build)
                rows.append(row(kind, side, gb, point, isa=build.get("fermium_isa")))
                print(_cell(rows[-1]), flush=True)
                (a.out / "results.json").write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=2) + "\n")
    text = table(rows, header)
    (a.out / "table.md").write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
