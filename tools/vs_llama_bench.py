"""Fermium against llama.cpp's llama-bench at long prompts and deep contexts, on the same GGUF and
threads, the two engines alternated run by run (llama.cpp, Fermium, llama.cpp, Fermium, ...).

    python tools/vs_llama_bench.py --llama-bench PATH --model M.gguf [--threads T]
                                   [--prompts P ...] [--depths D ...] [--reps N] [--tokens N]
                                   [--kv-type f16|q8_0|f32] [--isa X] [--json OUT] [--timeout S]
                                   [--max-busy CORES]
    e.g. python tools/vs_llama_bench.py --llama-bench /tmp/llcpp/.../build-cpu/bin/llama-bench \\
             --model /tmp/syn-q4_k_m.gguf --threads 2 --prompts 8192 32768 --depths 0 8192 32768 131072

(`python tools/vs_llama_cpp.py --llama-bench PATH ...` runs this too.) PATH is `llama-bench` as
`tools/fetch_llama_cpp.sh DEST --build cpu` builds it. Each point is REPS pairs of fresh processes:

- prompt P: `llama-bench -p P -n 0` against `fermium bench cpu-prefill --prompt P`, prompt tok/s;
- depth D: `llama-bench -p 0 -n N -d D` against `fermium bench decode --context D --tokens N`, the
  tok/s of N decode steps after D tokens of context (both fill the context untimed, with a prefill).

llama-bench runs with `-r 1` (this tool repeats), `-fa 1` (flash attention, its fast CPU path),
`-t T`, its other settings at their defaults, and `-ctk K -ctv K` for the KV type; Fermium with
`--rounds 1` and `--kv-type K` where its bench has the flag (else its cache is f32, and the report
says so). llama-bench's warm-up repeats the whole prompt once untimed, Fermium's one chunk of it.
Prints per point the commands, each run's tok/s, both medians and the median of the Fermium over
llama.cpp ratios of the pairs; --json writes the same after every point, so a long run that is
stopped keeps what it measured. A run that fails or passes --timeout ends its point, not the tool.

Each run records how many cores processes other than its own kept busy meanwhile (/proc/stat
less the run's CPU time); with --max-busy the tool idles before each run until, over a second,
they keep at most CORES busy, and sets aside (and runs again) a pair during which they kept more
busy. Other work on the cores slows llama.cpp's decode far more than Fermium's (ggml waits for
all its threads after every op, so one thread put off its core stalls the others;
docs/performance.md has figures), so a ratio is fair only on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FERMIUM = [sys.executable, "-m", "fermium", "bench"]


class RunFailed(Exception):
    pass


@dataclass
class Point:
    kind: str                  # "prompt" (prefill of `size` tokens) or "depth" (decode after `size` tokens)
    size: int
    tokens: int                # decode steps timed per run (0 for a prompt)
    llama_cmd: list[str]
    fermium_cmd: list[str]
    llama_tok_s: list[float] = field(default_factory=list)
    fermium_tok_s: list[float] = field(default_factory=list)
    llama_s: list[float] = field(default_factory=list)     # wall seconds of each run, with load and fill
    fermium_s: list[float] = field(default_factory=list)
    others_busy: list[list[float]] = field(default_factory=list)   # per pair: cores others kept busy in each run
    discarded: list[list[float]] = field(default_factory=list)     # pairs over --max-busy: tok/s and busy cores
    fermium_extra: list[dict] = field(default_factory=list)  # per kept run: fermium_extra of its report
    error: str | None = None

    @property
    def label(self) -> str:
        return f"prompt {self.size}" if self.kind == "prompt" else f"depth {self.size}"

    def summary(self) -> dict:
        pairs = list(zip(self.llama_tok_s, self.fermium_tok_s))
        out = {"label": self.label, "pairs": len(pairs), "set_aside": len(self.discarded)}
        if pairs:
            ratios = [fm / lc for lc, fm in pairs]
            out.update(llama_median=statistics.median(self.llama_tok_s),
                       fermium_median=statistics.median(self.fermium_tok_s),
                       ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                       others_busy_max=max(max(b) for b in self.others_busy))
        return out


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by every process (from /proc/stat) and by this tool's children."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), children.ru_utime + children.ru_stime


def _others(before: tuple[float, float], wall: float) -> float:
    """Cores that processes other than this tool's children kept busy since `before`."""
    now = _cpu_seconds()
    return max(0.0, (now[0] - before[0]) - (now[1] - before[1])) / wall


def wait_quiet(max_busy: float | None) -> None:
    """Idle a second; with max_busy, until other processes keep at most that many cores busy."""
    while True:
        before = _cpu_seconds()
        time.sleep(1.0)
        busy = _others(before, 1.0)
        if max_busy is None or busy <= max_busy:
            return
        print(f"  waiting: other processes keep {busy:.1f} cores busy", flush=True)
        time.sleep(4)


def _run(cmd: list[str], timeout: float | None) -> tuple[str, float, float]:
    """stdout of a run, its wall seconds and the cores others kept busy meanwhile."""
    before, t0 = _cpu_seconds(), time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"{shlex.join(cmd)}: no result after {timeout:.0f} s") from exc
    if out.returncode != 0:
        raise RunFailed(f"{shlex.join(cmd)} exited {out.returncode}:\n{out.stderr[-1500:]}")
    wall = time.perf_counter() - t0
    return out.stdout, wall, _others(before, wall)


def llama_row(cmd: list[str], timeout: float | None) -> tuple[dict, float, float]:
    """The one jsonl row of a llama-bench run of one test, with _run's seconds and others' cores."""
    stdout, seconds, others = _run(cmd, timeout)
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if len(rows) != 1:
        raise RunFailed(f"{shlex.join(cmd)} printed {len(rows)} jsonl rows, not 1")
    return rows[0], seconds, others


def fermium_report(cmd: list[str], timeout: float | None) -> tuple[dict, float, float]:
    stdout, seconds, others = _run(cmd, timeout)
    if "{" not in stdout:
        raise RunFailed(f"{shlex.join(cmd)} printed no JSON")
    return json.loads(stdout[stdout.index("{"):]), seconds, others


def fermium_extra(report: dict) -> dict:
    """Of a Fermium report, what a point keeps beside tok/s: a decode's share of the bandwidth, the
    bandwidth it measured and the weight GB of a step (llama.cpp's share is its tok/s times those GB
    over that bandwidth), and the memory."""
    extra = {k: report[k] for k in ("median_bw_ratio", "memory") if k in report}
    if report.get("rounds"):
        extra["membw_gbs"] = statistics.median(r["membw_gbs"] for r in report["rounds"])
        extra["gb_per_step"] = statistics.median(r["weights_gb_per_step"] for r in report["rounds"])
    return extra


def fermium_has_kv_type() -> bool:
    """Whether both Fermium benches take --kv-type (read from their --help)."""
    env = dict(os.environ, COLUMNS="200", TERM="dumb", NO_COLOR="1")
    helps = [subprocess.run([*FERMIUM, cmd, "--help"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
             for cmd in ("decode", "cpu-prefill")]
    return all("--kv-type" in h for h in helps)


def llama_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    lines = [x.strip() for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    return "; ".join(x for x in lines if x.startswith(("version", "built"))) or "; ".join(lines[-2:])


def build_points(a: argparse.Namespace, kv_flag: list[str]) -> list[Point]:
    lb = [str(a.llama_bench), "-m", str(a.model), "-t", str(a.threads), "-r", "1", "-fa", "1", "-o", "jsonl",
          "-ctk", a.kv_type, "-ctv", a.kv_type]
    common = ["--model", str(a.model), "--threads", str(a.threads), "--rounds", "1", *kv_flag,
              *(["--isa", a.isa] if a.isa else []), "--json"]
    points = [Point("prompt", p, 0, [*lb, "-p", str(p), "-n", "0"],
                    [*FERMIUM, "cpu-prefill", "--prompt", str(p), "--baseline-tokens", "0", *common])
              for p in a.prompts]
    points += [Point("depth", d, a.tokens, [*lb, "-p", "0", "-n", str(a.tokens), "-d", str(d)],
                     [*FERMIUM, "decode", "--context", str(d), "--tokens", str(a.tokens), *common])
               for d in a.depths]
    return points


def measure(point: Point, a: argparse.Namespace, build: dict) -> None:
    """REPS pairs of runs, llama.cpp first in each; the first failure ends the point. With
    --max-busy, a pair during which others kept more cores busy is set aside and run again, up to
    2 x REPS times."""
    key = "median_prompt_tok_s" if point.kind == "prompt" else "median_tok_s"
    try:
        while len(point.llama_tok_s) < a.reps and len(point.discarded) < 2 * a.reps:
            wait_quiet(a.max_busy)
            row, seconds, lc_busy = llama_row(point.llama_cmd, a.timeout)
            want = (point.size, 0, 0) if point.kind == "prompt" else (0, point.tokens, point.size)
            got = (row["n_prompt"], row["n_gen"], row["n_depth"], row.get("type_k"), row.get("type_v"))
            if got != (*want, a.kv_type, a.kv_type):
                raise RunFailed(f"llama-bench ran n_prompt, n_gen, n_depth, type_k, type_v = {got}")
            build.update({k: row.get(k) for k in ("build_commit", "build_number", "cpu_info", "type_k",
                                                  "type_v", "flash_attn", "n_batch", "n_ubatch")})
            lc_tok_s, lc_s = float(row["avg_ts"]), seconds
            wait_quiet(a.max_busy)
            report, seconds, fm_busy = fermium_report(point.fermium_cmd, a.timeout)
            if report.get("kv_type", build["fermium_kv_type"]) != build["fermium_kv_type"]:
                raise RunFailed(f"Fermium ran KV {report['kv_type']}, not {build['fermium_kv_type']}")
            build["fermium_isa"] = report.get("isa")
            fm_tok_s = float(report[key])
            kept = a.max_busy is None or max(lc_busy, fm_busy) <= a.max_busy
            print(f"  {point.label}: llama.cpp {lc_tok_s:8.2f} tok/s ({lc_s:.1f} s)   Fermium {fm_tok_s:8.2f} tok/s "
                  f"({seconds:.1f} s)   others' cores busy {lc_busy:.1f}/{fm_busy:.1f}"
                  + ("" if kept else "   set aside: others were busy"), flush=True)
            if not kept:
                point.discarded.append([lc_tok_s, fm_tok_s, lc_busy, fm_busy])
                continue
            point.llama_tok_s.append(lc_tok_s)
            point.llama_s.append(lc_s)
            point.fermium_tok_s.append(fm_tok_s)
            point.fermium_s.append(seconds)
            point.others_busy.append([lc_busy, fm_busy])
            point.fermium_extra.append(fermium_extra(report))
    except RunFailed as exc:
        point.error = str(exc)
        print(f"  {point.label} failed: {exc}", flush=True)


def _line(s: dict) -> str:
    if not s["pairs"]:
        return f"  {s['label']}: no pair measured ({s['set_aside']} set aside)"
    return (f"  {s['label']}, medians: llama.cpp {s['llama_median']:8.2f}  Fermium {s['fermium_median']:8.2f} tok/s "
            f"(of {s['pairs']}, {s['set_aside']} set aside)   Fermium / llama.cpp {s['ratio']:.2f}x "
            f"(pairs {s['ratio_min']:.2f}-{s['ratio_max']:.2f}; others busy up to {s['others_busy_max']:.1f} cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.splitlines()[:2]))
    parser.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's llama-bench")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, nargs="*", default=[8192, 32768], help="prompt lengths to prefill")
    parser.add_argument("--depths", type=int, nargs="*", default=[0, 8192, 32768, 131072],
                        help="context depths to decode after")
    parser.add_argument("--reps", type=int, default=3, help="pairs of runs per point")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps timed per run, both engines")
    parser.add_argument("--kv-type", default="f16", choices=["f16", "q8_0", "f32"])
    parser.add_argument("--isa", help="force Fermium's kernels (generic, ssse3, avx2, avx512, avx512vbmi)")
    parser.add_argument("--timeout", type=float, help="seconds one run may take before its point is given up")
    parser.add_argument("--max-busy", type=float, help="wait before each run until other processes keep at "
                                                           "most this many cores busy, and repeat a pair during "
                                                           "which they kept more")
    parser.add_argument("--json", type=Path, help="write the results here, after every point")
    a = parser.parse_args()
    for path in (a.llama_bench, a.model):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    if not a.prompts and not a.depths:
        parser.error("give --prompts or --depths")
    kv_flag = ["--kv-type", a.kv_type] if fermium_has_kv_type() else []
    version = llama_version(a.llama_bench)
    build: dict = {"fermium_kv_type": a.kv_type if kv_flag else "f32 (its bench has no --kv-type)"}
    points = build_points(a, kv_flag)
    print("$ python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    print(f"llama-bench: {version}")
    print(f"model {a.model.name}  threads {a.threads}  reps {a.reps}  KV: llama.cpp {a.kv_type}, "
          f"Fermium {build['fermium_kv_type']}", flush=True)
    for point in points:
        print(f"{point.label}:\n  $ {shlex.join(point.llama_cmd)}\n  $ {shlex.join(point.fermium_cmd)}", flush=True)
        measure(point, a, build)
        print(_line(point.summary()), flush=True)
        if a.json:
            a.json.write_text(json.dumps({
                "command": sys.argv, "model": str(a.model), "threads": a.threads, "reps": a.reps,
                "tokens": a.tokens, "kv_type": a.kv_type, "llama_version": version, "build": build,
                "points": [{**asdict(p), **p.summary()} for p in points]}, indent=2) + "\n")
    print(f"\nllama.cpp {build.get('build_commit')} (build {build.get('build_number')}), "
          f"{build.get('cpu_info')}; Fermium isa {build.get('fermium_isa')}")
    print("| point | llama.cpp tok/s | Fermium tok/s | Fermium / llama.cpp | others' cores busy, most |\n"
          "|---|---|---|---|---|")
    for p in points:
        s = p.summary()
        print(f"| {s['label']} | " + (f"{s['llama_median']:.1f} | {s['fermium_median']:.1f} | {s['ratio']:.2f}x | "
                                     f"{s['others_busy_max']:.1f} |" if s["pairs"]
                                     else f"{'failed' if p.error else 'no quiet pair'} | | | |"))


if __name__ == "__main__":
    main()
