"""`fermium bench prefill --model FILE` (fermium/prefill_bench.py) on a tiny GGUF under tests/cuda_emulator,
and the errors for a file it cannot run, from the script and from the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fermium import prefill_bench
from native.cuda.device_peak import fp32_peak
from services.prefill.backends import cuda as cuda_backend

from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import TinySpec, build
from .test_cuda_backend_emulated import budget_for

PROMPTS = [40, 70]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny") / "qwen35moe.gguf", TinySpec())


@pytest.fixture()
def emulated(monkeypatch):
    driver = emulate_cuda(monkeypatch)
    # the emulator reports no SM count or clock: a Tesla C2075's (14 SMs of compute 2.0 at 1.15 GHz)
    monkeypatch.setattr(prefill_bench, "device_peak", lambda device: fp32_peak("emulated C2075", 14, (2, 0), 1150000))
    monkeypatch.setattr(cuda_backend.CUDABackend, "availability", classmethod(lambda cls: (True, "emulated")))
    return driver


def streamed_budget(path) -> int:
    from common.model.gguf_file import GGUFModel
    return budget_for(GGUFModel(path), 0.0, max(PROMPTS))


def bench_args(tiny, *more: str) -> list[str]:
    return ["--model", str(tiny), "--budget", str(streamed_budget(tiny)), "--prompts", *map(str, PROMPTS),
            "--bandwidth-bytes", str(1 << 20), *more]


def test_the_model_path_runs_a_gguf_file_and_reports_its_figures(tiny, emulated, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert prefill_bench.main(bench_args(tiny, "--compare-staging", "--out", str(out))) == 0
    text = capsys.readouterr().out
    assert f"model {tiny}:" in text and "4 layers, 8 experts of 256, vocabulary 512" in text
    assert "staging: " in text and "staged by register in" in text and "staged by copy in" in text
    assert "copy / register staging time:" in text and "14 SMs x 32 fp32 lanes (compute 2.0)" in text
    for T in PROMPTS:
        assert f"{T:5d} tokens:" in text
    fig = json.loads(out.read_text())
    assert fig["model"] == str(tiny) and fig["staging"]["method"] == "register" and fig["staging"]["bytes"] > 0
    cmp = fig["staging_compared"]
    assert cmp["copy"]["method"] == "copy" and cmp["register"]["method"] == "register"
    assert cmp["copy"]["bytes"] == cmp["register"]["bytes"] == fig["staging"]["bytes"] and cmp["copy_over_register"] > 0
    assert [r["tokens"] for r in fig["runs"]] == PROMPTS
    for run in fig["runs"]:
        assert run["logits_finite"] and run["h2d_bytes"] > 0 and run["flops"] > 0 and run["compute_s"] > 0
        assert np.isclose(run["achieved_tflops"] * 1e12, run["flops"] / run["compute_s"])
        assert np.isclose(run["peak_share"], run["achieved_tflops"] * 1e12 / fig["fp32_peak_flops"])
        assert run["c2075_estimate_s"] == max(run["c2075_copy_s"], run["c2075_compute_s"]) > 0


def test_the_command_line_passes_the_file_and_the_staging_through(tiny, emulated, tmp_path, monkeypatch):
    from fermium.cli import app
    real = prefill_bench.pinned_bandwidth
    monkeypatch.setattr(prefill_bench, "pinned_bandwidth", lambda cuda, nbytes: real(cuda, 1 << 20))  # not 1 GiB
    out = tmp_path / "bench.json"
    budget = str(streamed_budget(tiny))
    res = CliRunner().invoke(app, ["bench", "prefill", "--model", str(tiny), "--budget", budget, "--prompt", "40",
                                   "--staging", "copy", "--out", str(out)])
    assert res.exit_code == 0, res.output
    fig = json.loads(out.read_text())
    assert fig["staging"]["method"] == "copy" and [r["tokens"] for r in fig["runs"]] == [40]


def _non_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_bytes(b"this is not a model file" * 10)
    return p, "not a GGUF file (bad magic)"


def _missing(tmp_path):
    return tmp_path / "absent.gguf", "no such file"


def _other_arch(tmp_path):
    path = build(tmp_path / "next.gguf", TinySpec(arch="qwen3next"))
    return path, "architecture 'qwen3next'; the benchmark runs qwen35moe"


@pytest.mark.parametrize("bad", [_missing, _non_gguf, _other_arch], ids=["missing", "not-gguf", "other-arch"])
def test_a_file_it_cannot_run_exits_2_naming_the_file_and_the_problem(tmp_path, capsys, bad):
    from fermium.cli import app
    path, problem = bad(tmp_path)
    assert prefill_bench.main(["--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"fermium bench prefill: {path}: " in err and problem in err
    res = CliRunner().invoke(app, ["bench", "prefill", "--model", str(path)])
    assert res.exit_code == 2
    assert f"{path}: " in res.output and problem in res.output and "unavailable" not in res.output


def test_options_that_need_the_other_model_are_refused(tiny, capsys):
    assert prefill_bench.main(["--model", str(tiny), "--layers", "2"]) == 2
    assert prefill_bench.main(["--compare-staging"]) == 2
    err = capsys.readouterr().err
    assert "--layers applies to the synthetic model only" in err and "--compare-staging needs --model" in err
