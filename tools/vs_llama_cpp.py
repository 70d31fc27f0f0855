"""Fermium's CPU decode against llama.cpp's on the same GGUF and machine, alternating the two REPS
times, as ratios run by run.

    python tools/vs_llama_cpp.py --batched-bench PATH --model M.gguf [--threads T] [--batch B]
                                 [--isa X] [--reps N] [--tokens N] [--prompt P]
    e.g. python tools/vs_llama_cpp.py --batched-bench ~/llama.cpp/build/bin/llama-batched-bench \\
             --model /tmp/syn-q4_k_m.gguf --threads 2 --batch 4

PATH is llama.cpp's `llama-batched-bench` (build it from the tree that tools/fetch_llama_cpp.sh
fetches: `cmake -B build && cmake --build build --target llama-batched-bench`; a build with
-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF is its SSSE3
path, to set against `--isa ssse3`). The model needs the keys llama.cpp loads: a converted
checkpoint, or tools/make_synthetic_gguf.py, which writes a tokenizer of kind "none".

Each run of llama.cpp decodes TOKENS tokens after a 16-token prompt, one sequence and then B;
each run of Fermium is `fermium bench decode` with the same threads and batch. Both read the same
weights per token, so llama.cpp's share of the memory bandwidth is its tok/s times Fermium's GB
per step over the bandwidth that Fermium's run measured.

With --prompt P, the prompt is compared instead: llama.cpp's prompt processing of P tokens
(llama-batched-bench -npp P) against `fermium bench cpu-prefill --prompt P`, the prefill
service's cpu backend.

With --llama-bench PATH instead of --batched-bench, tools/vs_llama_bench.py runs: long prompts and
deep contexts against llama-bench (see its docstring for the arguments).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _llama_rows(cmd: list[str], count: int) -> list[dict]:
    """The jsonl rows of one llama-batched-bench run, which must print `count` of them."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(line) for line in (out.stdout + out.stderr).splitlines() if line.startswith('{"n_kv_max"')]
    if out.returncode != 0 or len(rows) != count:
        sys.exit(f"llama.cpp failed ({shlex.join(cmd)}):\n{out.stderr[-2000:]}")
    return rows


def _fermium_json(args: list[str]) -> dict:
    """The report of one `fermium bench ... --json` run, in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "fermium", "bench", *args, "--json"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0 or "{" not in out.stdout:
        sys.exit(f"fermium bench {args[0]} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout[out.stdout.index("{"):])


def _alternate(reps: int, first, second) -> list[tuple]:
    """(first(), second()) REPS times, the two called in the other order every other time."""
    runs = []
    for r in range(reps):
        if r % 2 == 0:
            a = first()
            runs.append((a, second()))
        else:
            b = second()
            runs.append((first(), b))
    return runs


def llama_cpp(binary: Path, model: Path, threads: int, batch: int, tokens: int) -> dict[int, float]:
    """Aggregate decode tok/s of llama.cpp by batch size: {1: ..., batch: ...}."""
    sizes = sorted({1, batch})
    rows = _llama_rows([str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
                        "-c", str((16 + tokens) * max(sizes)), "-b", "512", "-ub", "512", "-npp", "16",
                        "-ntg", str(tokens), "-npl", ",".join(map(str, sizes)), "--output-format", "jsonl"], len(sizes))
    return {int(r["pl"]): float(r["speed_tg"]) for r in rows}


def llama_cpp_prompt(binary: Path, model: Path, threads: int, prompt: int) -> float:
    """llama.cpp's prompt tok/s for one sequence of `prompt` tokens."""
    rows = _llama_rows([str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", str(prompt + 8),
                        "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", "1", "-npl", "1",
                        "--output-format", "jsonl"], 1)
    return float(rows[0]["speed_pp"])


def _isa(isa: str | None) -> list[str]:
    return ["--isa", isa] if isa else []


def fermium_prompt(model: Path, threads: int, isa: str | None, prompt: int) -> float:
    return _fermium_json(["cpu-prefill", "--model", str(model), "--threads", str(threads), "--prompt", str(prompt),
                          "--rounds", "3", "--baseline-tokens", "0", *_isa(isa)])["median_prompt_tok_s"]


def compare_prompts(a: argparse.Namespace) -> None:
    runs = _alternate(a.reps, lambda: llama_cpp_prompt(a.batched_bench, a.model, a.threads, a.prompt),
                      lambda: fermium_prompt(a.model, a.threads, a.isa, a.prompt))
    print("$ python tools/vs_llama_cpp.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    print(f"model {a.model.name}  threads {a.threads}  prompt {a.prompt}")
    print("prompt tok/s: llama.cpp " + " ".join(f"{lc:7.1f}" for lc, _ in runs)
          + "   Fermium " + " ".join(f"{fm:7.1f}" for _, fm in runs)
          + f"   Fermium / llama.cpp, run by run: {statistics.median(fm / lc for lc, fm in runs):.2f}x")


def fermium(model: Path, threads: int, batch: int, isa: str | None, tokens: int) -> dict:
    report = _fermium_json(["decode", "--model", str(model), "--threads", str(threads), "--batch", str(batch),
                            "--rounds", "3", "--tokens", str(tokens), *_isa(isa)])
    if batch > 1:
        tok_1 = [r["tok_s"] / r["batch_gain"] for r in report["rounds"]]
    else:
        tok_1 = [r["tok_s"] for r in report["rounds"]]
    return {
        "tok_s": {1: statistics.median(tok_1), batch: report["median_tok_s"]},
        "gb_per_token": statistics.median(r["weights_gb_per_step"] for r in report["rounds"]) if batch == 1 else None,
        "membw_gbs": statistics.median(r["membw_gbs"] for r in report["rounds"]),
        "bw_ratio": report["median_bw_ratio"] if batch == 1 else None,
        "isa": report["isa"],
    }


def main() -> None:
    if "--llama-bench" in sys.argv[1:]:
        from vs_llama_bench import main as llama_bench_main  # this file's folder is on sys.path
        llama_bench_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batched-bench", type=Path, required=True, help="llama.cpp's llama-batched-bench")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="also compare B sequences decoded together")
    parser.add_argument("--isa", help="force Fermium's kernels (generic, ssse3, avx2, avx512, avx512vbmi)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16, help="decode steps per run")
    parser.add_argument("--prompt", type=int, default=0, help="compare the prefill of a prompt this long instead")
    a = parser.parse_args()
    for path in (a.batched_bench, a.model):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    if a.prompt:
        compare_prompts(a)
        return
    runs = _alternate(a.reps, lambda: llama_cpp(a.batched_bench, a.model, a.threads, a.batch, a.tokens),
                      lambda: fermium(a.model, a.threads, a.batch, a.isa, a.tokens))
    print("$ python tools/vs_llama_cpp.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    print(f"model {a.model.name}  threads {a.threads}  Fermium isa {runs[0][1]['isa']}")
    for b in sorted({1, a.batch}):
        lc_tok = [lc[b] for lc, _ in runs]
        fm_tok = [fm["tok_s"][b] for _, fm in runs]
        ratio = statistics.median(fm / lc for fm, lc in zip(fm_tok, lc_tok))
        print(f"batch {b}: llama.cpp tok/s " + " ".join(f"{x:6.2f}" for x in lc_tok)
              + "   Fermium tok/s " + " ".join(f"{x:6.2f}" for x in fm_tok)
              + f"   Fermium / llama.cpp, run by run: {ratio:.2f}x")
    if a.batch == 1:
        shares = [lc[1] * fm["gb_per_token"] * 1e9 / (fm["membw_gbs"] * 1e9) for lc, fm in runs]
        print(f"share of the measured bandwidth, median: llama.cpp {100 * statistics.median(shares):.1f}%, "
              f"Fermium {100 * statistics.median(fm['bw_ratio'] for _, fm in runs):.1f}%")
    else:
        for name, gain in (("llama.cpp", [lc[a.batch] / lc[1] for lc, _ in runs]),
                           ("Fermium", [fm["tok_s"][a.batch] / fm["tok_s"][1] for _, fm in runs])):
            print(f"batch {a.batch} against 1, {name}: " + " ".join(f"{g:.2f}x" for g in gain))


if __name__ == "__main__":
    main()
