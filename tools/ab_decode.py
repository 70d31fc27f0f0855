"""A change to the CPU runner measured as a ratio in one run: `fermium bench decode` of git
revision REV against the working tree's, alternating the two REPS times on the same model.

    python tools/ab_decode.py REV [--reps N] -- BENCH_ARGS...
    e.g. python tools/ab_decode.py HEAD~1 --reps 4 -- --model /tmp/syn-q4_k_m.gguf --threads 2 --isa ssse3

REV is checked out into a temporary worktree and its native extension built there; the working
tree runs with its extension as last built (`pip install -e .`). Each run is a fresh process with
its tree first on the path. Prints each run's median tok/s, share of the
measured bandwidth and batch gain, then the working tree's tok/s over REV's, run by run.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(tree: Path, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-m", "fermium", "bench", "decode", *args, "--json"],
                         cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0 or "{" not in out.stdout:
        sys.exit(f"bench failed in {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout[out.stdout.index("{"):])


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=__doc__.splitlines()[3].strip())
    parser.add_argument("rev")
    parser.add_argument("--reps", type=int, default=4)
    a = parser.parse_args(argv[:cut])
    bench_args = argv[cut + 1:]
    if not bench_args:
        parser.error("give the bench decode arguments after --")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), a.rev], check=True)
        try:
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=base, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            trees = {a.rev: base, "working tree": ROOT}
            runs: dict[str, list[dict]] = {k: [] for k in trees}
            for r in range(a.reps):   # alternate which side goes first
                for label in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    runs[label].append(bench(trees[label], bench_args))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print("$ python tools/ab_decode.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    for label, rs in runs.items():
        tok = " ".join(f"{r['median_tok_s']:6.2f}" for r in rs)
        bw = " ".join(f"{100 * r['median_bw_ratio']:5.1f}%" for r in rs)
        gains = " ".join(f"{r['median_batch_gain']:.2f}x" for r in rs if "median_batch_gain" in r)
        print(f"{label:>14s}: tok/s {tok}  bandwidth {bw}" + (f"  batch gain {gains}" if gains else ""))
    ratio = statistics.median(w["median_tok_s"] / b["median_tok_s"] for w, b in zip(runs["working tree"], runs[a.rev]))
    print(f"working tree / {a.rev}, tok/s run by run: {ratio:.3f}x")


if __name__ == "__main__":
    main()
