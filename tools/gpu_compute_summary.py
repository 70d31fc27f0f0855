"""The summary of tools/gpu_compute_bench.sh's measure phase, against issue 33's goals.

Reads from OUT: gemm.json (tools/bench_cuda_gemm.py), prefill-file-*.json and
prefill-synthetic.json (`fermium bench prefill --out`), llama.jsonl (`llama-bench -o jsonl`, one
row per configuration and prompt, every run appended). Missing inputs are named, not guessed.
A file run made with --phases adds its phase table (native/cuda/phases.py) per prompt.

    python tools/gpu_compute_summary.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fermium.prefill_bench_figures import C2075_FLOPS, C2075_PCIE, PAPER_947_SECONDS  # noqa: E402
from native.cuda.phases import phase_lines  # noqa: E402

PROMPTS = (947, 4096)
GOAL_SPEEDUP = 3.0
GOAL_OVERLAP = 1.10
GOAL_EXPERT_SHARE = 0.50


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def llama_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]
    return [r for r in rows if r.get("n_gen", 0) == 0 and r.get("n_prompt", 0) > 0]


def llama_config(row: dict) -> str:
    return f"-ngl {row.get('n_gpu_layers')} -ub {row.get('n_ubatch')} -b {row.get('n_batch')}"


def gemm_lines(gemm) -> list[str]:
    if gemm is None:
        return ["GEMMs: no gemm.json"]
    lines = [f"GEMMs on {gemm['peak']}"]
    experts = [r for r in gemm["rows"] if r["gemm"].startswith("experts")]
    for r in experts:
        share = r["peak_share"]["new"]
        lines.append(f"  {r['type']:5s} {r['gemm']:26s} T={r['tokens']:5d}: {r['tflops']['new']:6.2f} TFLOP/s = "
                     f"{100 * share:4.1f}% of peak (goal {100 * GOAL_EXPERT_SHARE:.0f}%: "
                     f"{'met' if share >= GOAL_EXPERT_SHARE else 'not met'})")
    if experts:
        shares = [r["peak_share"]["new"] for r in experts]
        lines.append(f"  expert GEMMs: {100 * min(shares):.1f}-{100 * max(shares):.1f}% of peak; "
                     f"{sum(s >= GOAL_EXPERT_SHARE for s in shares)} of {len(shares)} at the goal")
    dense = [r["peak_share"]["new"] for r in gemm["rows"] if r["gemm"].startswith("dense")]
    if dense:
        lines.append(f"  dense GEMMs: {100 * min(dense):.1f}-{100 * max(dense):.1f}% of peak")
    return lines


def c2075_lines(run: dict, name: str) -> list[str]:
    """The estimate `fermium bench prefill` prints (copy and compute at the C2075's peak, overlapped),
    and one from the kernel efficiency measured here (compute at that share of the C2075's peak, plus
    the streamed bytes over PCIe 2.0, not overlapped)."""
    measured = run["flops"] / (run["peak_share"] * C2075_FLOPS) + run["h2d_bytes"] / C2075_PCIE
    return [f"  C2075, as fermium bench prefill prints it ({name}, {run['tokens']} tokens): "
            f"{run['c2075_estimate_s']:.1f} s = max({run['c2075_copy_s']:.1f} s copy, "
            f"{run['c2075_compute_s']:.1f} s compute at 100% of 1.03 TFLOP/s); paper {PAPER_947_SECONDS} s for 947",
            f"  C2075 from the measured efficiency ({name}, {run['tokens']} tokens): {measured:.1f} s = "
            f"{run['flops'] / 1e12:.2f} TFLOP / ({100 * run['peak_share']:.1f}% x 1.03 TFLOP/s) + "
            f"{run['h2d_bytes'] / 1e9:.2f} GB / 6 GB/s; paper {PAPER_947_SECONDS} s for 947"]


def summary(out: Path) -> list[str]:
    lines = gemm_lines(load(out / "gemm.json"))
    files = sorted(out.glob("prefill-file-*.json"))
    fermium = {T: [] for T in PROMPTS}
    runs_by_T = {T: [] for T in PROMPTS}
    for f in files:
        fig = load(f)
        for run in fig["runs"]:
            if run["tokens"] in fermium:
                fermium[run["tokens"]].append(run["tok_per_s"])
                runs_by_T[run["tokens"]].append(run)
        if "staging_compared" in fig:
            cmp = fig["staging_compared"]
            lines.append(f"staging ({f.name}): {fig['staging']['method']} {fig['staging']['gb_per_s']:.2f} GB/s; "
                         + ", ".join(f"{h} {cmp[h].get('gb_per_s', 0):.2f} GB/s" if "refused" not in cmp[h]
                                     else f"{h} refused" for h in ("copy", "register"))
                         + (f"; copy / register time {cmp['copy_over_register']:.2f}"
                            if "copy_over_register" in cmp else ""))
    if not files:
        lines.append("Fermium on the file: no prefill-file-*.json")
    llama = llama_rows(out / "llama.jsonl")
    if not llama:
        lines.append("llama.cpp: no llama.jsonl rows")
    lines.append("prefill on the file, tok/s (every run; best used):")
    for T in PROMPTS:
        mine = fermium[T]
        theirs = {}
        for r in llama:
            if r["n_prompt"] == T:
                theirs.setdefault(llama_config(r), []).append(r["avg_ts"])
        for config, ts in sorted(theirs.items()):
            lines.append(f"  {T:5d} tokens, llama-bench {config}: " + ", ".join(f"{v:.0f}" for v in ts))
        lines.append(f"  {T:5d} tokens, Fermium 6 GiB budget: " + (", ".join(f"{v:.0f}" for v in mine) or "none"))
        if mine and theirs:
            best_config, best = max(((c, max(ts)) for c, ts in theirs.items()), key=lambda cb: cb[1])
            ratio = max(mine) / best
            lines.append(f"  {T:5d} tokens: Fermium {max(mine):.0f} / llama.cpp best {best:.0f} ({best_config}) = "
                         f"{ratio:.2f}x (goal {GOAL_SPEEDUP:.0f}x: {'met' if ratio >= GOAL_SPEEDUP else 'not met'})")
    for T in PROMPTS:
        for i, run in enumerate(runs_by_T[T], 1):
            o = run["overlap_ratio"]
            lines.append(f"  {T:5d} tokens, file run {i}: wall {run['wall_s']:.3f} s / max(copy {run['copy_s']:.3f}, "
                         f"compute {run['compute_s']:.3f}) = {o:.2f} (goal <= {GOAL_OVERLAP:.2f}: "
                         f"{'met' if o <= GOAL_OVERLAP else 'not met'}); {run['achieved_tflops']:.1f} TFLOP/s = "
                         f"{100 * run['peak_share']:.1f}% of peak in the compute spans; "
                         f"H2D {100 * run['h2d_vs_pinned']:.0f}% of pinned")
            if run.get("phases"):
                lines += phase_lines(run["phases"], indent="    ")
    synthetic = load(out / "prefill-synthetic.json")
    for run in (synthetic or {}).get("runs", []):
        lines.append(f"  {run['tokens']:5d} tokens, synthetic 40 layers: {run['tok_per_s']:.0f} tok/s, overlap "
                     f"{run['overlap_ratio']:.2f}, {run['achieved_tflops']:.1f} TFLOP/s = "
                     f"{100 * run['peak_share']:.1f}% of peak")
    if runs_by_T[947]:
        lines += c2075_lines(runs_by_T[947][0], "file")
    elif synthetic and any(r["tokens"] == 947 for r in synthetic["runs"]):
        lines += c2075_lines(next(r for r in synthetic["runs"] if r["tokens"] == 947), "synthetic")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print("\n".join(summary(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
