"""tools/gpu_compute_bench.sh and its summary (tools/gpu_compute_summary.py) on made-up figures: the
goals of issue 33 read from the JSON and jsonl the measure phase writes, and the commands it runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from native.cuda.phases import IDLE, report
from tools.gpu_compute_summary import summary

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_compute_bench.sh"


def prefill_run(T: int, tok_per_s: float, overlap: float = 1.05) -> dict:
    wall = T / tok_per_s
    return {"tokens": T, "wall_s": wall, "tok_per_s": tok_per_s, "h2d_bytes": 15e9, "copy_s": wall / overlap,
            "compute_s": wall / overlap / 2, "h2d_vs_pinned": 0.95, "overlap_ratio": overlap, "flops": 4.85e12,
            "achieved_tflops": 20.0, "peak_share": 0.25, "c2075_copy_s": 2.5, "c2075_compute_s": 4.7,
            "c2075_estimate_s": 4.7}


def llama_row(T: int, ub: int, b: int, ts: float) -> str:
    return json.dumps({"n_prompt": T, "n_gen": 0, "n_gpu_layers": 0, "n_ubatch": ub, "n_batch": b, "avg_ts": ts})


def phase_row(name: str, where: str, seconds: float, calls: int, flops: float = 0.0) -> dict:
    return {"name": name, "where": where, "seconds": seconds, "calls": calls, "flops": flops}


def phases() -> dict:
    """A --phases report as native/cuda/phases.py makes it: 2 s of span."""
    row = phase_row
    return report(2.0, [row("deltanet chunk prep and scan", "stream", 0.5, 30),
                        row("expert gate/up", "stream", 1.0, 400, flops=30e12), row(IDLE, "gap", 0.5, 900),
                        row("expert tables, first copies issued", "host", 0.25, 40)])


def write_figures(out: Path) -> None:
    staging = {"method": "register", "seconds": 2.0, "bytes": 15e9, "gb_per_s": 7.5}
    (out / "prefill-file-1.json").write_text(json.dumps({"staging": staging, "runs": [
        prefill_run(947, 1100.0), prefill_run(4096, 4000.0, overlap=1.2)], "staging_compared": {
        "copy": {**staging, "method": "copy"}, "register": {"method": "register", "refused": "no"}}}))
    (out / "prefill-file-2.json").write_text(json.dumps({"staging": staging, "runs": [
        prefill_run(947, 1200.0), {**prefill_run(4096, 3900.0), "phases": phases()}]}))
    (out / "llama.jsonl").write_text("\n".join([
        llama_row(947, 512, 2048, 156.0), llama_row(4096, 512, 2048, 170.0),
        llama_row(947, 4096, 4096, 392.0), llama_row(4096, 4096, 4096, 1279.0), llama_row(947, 4096, 4096, 400.0),
        "| a markdown line is not a row |"]) + "\n")
    rows = [{"type": "q4_k", "gemm": g, "tokens": 947, "tflops": {"new": 66.9 * s}, "peak_share": {"new": s}}
            for g, s in (("experts gate/up 512x2048", 0.3), ("experts down 2048x512", 0.55),
                         ("dense qkv 8192x2048", 0.45))]
    (out / "gemm.json").write_text(json.dumps({"peak": "H200: 66.9 TFLOP/s fp32 peak", "rows": rows}))


def test_the_summary_takes_the_best_of_each_side_and_states_every_goal(tmp_path):
    write_figures(tmp_path)
    text = "\n".join(summary(tmp_path))
    assert "947 tokens: Fermium 1200 / llama.cpp best 400 (-ngl 0 -ub 4096 -b 4096) = 3.00x (goal 3x: met)" in text
    assert "4096 tokens: Fermium 4000 / llama.cpp best 1279 (-ngl 0 -ub 4096 -b 4096) = 3.13x (goal 3x: met)" in text
    assert "4096 tokens, llama-bench -ngl 0 -ub 512 -b 2048: 170" in text
    assert "= 1.20 (goal <= 1.10: not met)" in text and "= 1.05 (goal <= 1.10: met)" in text
    assert "30.0% of peak (goal 50%: not met)" in text and "55.0% of peak (goal 50%: met)" in text
    assert "expert GEMMs: 30.0-55.0% of peak; 1 of 2 at the goal" in text and "dense GEMMs: 45.0-45.0%" in text
    assert "copy 7.50 GB/s, register refused" in text
    measured = 4.85e12 / (0.25 * 1.03e12) + 15e9 / 6e9           # the first file run of 947 tokens
    assert f"C2075 from the measured efficiency (file, 947 tokens): {measured:.1f} s" in text
    assert "C2075, as fermium bench prefill prints it (file, 947 tokens): 4.7 s" in text
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if "4096 tokens, file run 2:" in line))
    assert "phases over a compute span of 2.000 s" in lines[at + 1]
    table = "\n".join(lines[at + 1:at + 9])
    assert "deltanet chunk prep and scan" in table and " 25.0% " in table and "    30" in table
    assert "expert gate/up" in table and "30.00" in table and " 50.0% " in table      # 30 TFLOP in 1 s
    assert f"{IDLE}" in table and "(host) expert tables, first copies issued" in table and " 12.5% " in table
    assert "stream phases + idle" in table and "100.0%" in table
    assert text.count("phases over a compute span") == 1                 # only the run that has them


def test_the_summary_names_what_is_missing(tmp_path):
    text = "\n".join(summary(tmp_path))
    assert "GEMMs: no gemm.json" in text and "no prefill-file-*.json" in text and "no llama.jsonl rows" in text


@pytest.mark.skipif(sys.platform != "linux", reason="the script is bash on the GPU host")
def test_the_measure_phase_runs_the_issues_commands_and_keeps_going_past_failures(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (work / "syn40-q4_k_m.gguf").write_bytes(b"")
    py = tmp_path / "py"            # says pycuda is there; everything else runs here, where no GPU is
    py.write_text(f'#!/usr/bin/env bash\n[[ "$1 $2" == "-c import pycuda" ]] && exit 0\nexec {sys.executable} "$@"\n')
    fake_llama = tmp_path / "llama-bench"
    fake_llama.write_text("#!/usr/bin/env bash\n" + "".join(
        f"echo '{llama_row(T, 512, 2048, 100.0)}'\n" for T in (947, 4096)))
    for f in (py, fake_llama):
        f.chmod(0o755)
    write_figures(tmp_path)
    out.mkdir()
    for name in ("prefill-file-1.json", "gemm.json"):        # as if the steps that fail here had written them
        (out / name).write_text((tmp_path / name).read_text())
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "SITE": str(tmp_path / "site"), "PY": str(py),
           "LLAMA_BENCH": str(fake_llama), "MEASURE_LIMIT_S": "300", "PYTHONPATH": str(REPO)}
    res = subprocess.run(["bash", str(SCRIPT), "measure"], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr       # the GEMM and prefill steps fail without a GPU
    commands = (out / "commands.txt").read_text()
    model = work / "syn40-q4_k_m.gguf"
    assert f"-m fermium bench prefill --model {model} --budget 6GiB --prompt 947 --prompt 4096 --compare-staging" \
        in commands
    assert f"--model {model} --budget 6GiB --prompt 947 --prompt 4096 --phases --out" in commands
    assert f"{fake_llama} -m {model} -ngl 0 -p 947,4096 -n 0 -r 2 -o jsonl -oe md" in commands
    assert commands.count("-ngl 0 -p 947,4096 -n 0 -r 2 -ub 4096 -b 4096 -o jsonl") == 2
    assert "fermium bench prefill --budget 6GiB --prompt 947 --prompt 4096 --out" in commands
    assert len((out / "llama.jsonl").read_text().splitlines()) == 6
    text = (out / "summary.txt").read_text()
    assert "947 tokens: Fermium 1100 / llama.cpp best 100 (-ngl 0 -ub 512 -b 2048) = 11.00x" in text
    assert "phase measure:" in text and "exit 1" in text


def test_the_script_parses_and_names_its_phases():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    res = subprocess.run(["bash", str(SCRIPT), "neither"], capture_output=True, text=True,
                         env={**os.environ, "OUT": "/tmp/fermium-compute-test-out", "PY": "true"})
    assert res.returncode == 2 and "build|measure" in res.stderr
