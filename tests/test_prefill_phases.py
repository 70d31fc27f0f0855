"""The cuda backend's phase clock (native/cuda/phases.py) under tests/cuda_emulator, where an event
holds the host clock at its record: every phase appears with a call per layer of its kind, the
stream rows and the idle gaps make up the span, and the prefill's outputs do not change with it on."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.state import SequenceState
from fermium import prefill_bench
from native.cuda.phases import IDLE, NULL_CLOCK, phase_lines
from services.prefill.backends import cuda as cuda_backend

from .test_bench_prefill_model import bench_args, emulated, streamed_budget, tiny  # noqa: F401 (fixtures)

EVERY_LAYER = ("input norm", "post norm", "router GEMM", "routing kernels, counts read back", "shared expert",
               "tile build, scatter", "expert combine")
LINEAR = ("deltanet input projections", "deltanet conv, l2 norms, gates", "deltanet chunk prep and scan",
          "deltanet gated norm", "deltanet output projection")
FULL = ("attention input projections", "attention q/k norms, rope", "attention kernel", "attention output projection")
GROUPS = ("expert gate/up", "expert down")         # once per group of experts in a layer
HOST = ("wait for the expert counts", "expert tables, first copies issued")
GEMMS = ("router GEMM", "shared expert", "deltanet input projections", "deltanet output projection",
         "attention input projections", "attention output projection", "attention kernel", "expert gate/up",
         "expert down", "final norm, LM head")
T = 70


def prefill(model, budget, phases: bool, tokens):
    backend = cuda_backend.CUDABackend(model, vram_budget=budget, pass_tokens=T, max_context=T, phases=phases)
    state = SequenceState.empty(model.config)
    logits = backend.prefill(tokens, state)
    report = backend.last_phases
    backend.close()
    return logits, state, report


def test_phases_cover_every_layer_and_sum_to_the_span_without_changing_the_outputs(tiny, emulated):  # noqa: F811
    model = GGUFModel(tiny)
    cfg = model.config
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, T).tolist()
    budget = streamed_budget(tiny)
    plain, plain_state, none = prefill(model, budget, False, tokens)
    timed, timed_state, report = prefill(model, budget, True, tokens)
    assert none is None
    assert np.array_equal(plain, timed)
    for name in ("conv", "ssm", "k", "v"):
        for a, b in zip(getattr(plain_state, name), getattr(timed_state, name)):
            assert np.array_equal(a, b)

    rows = {(r["where"], r["name"]): r for r in report["phases"]}
    stream = {n: r for (w, n), r in rows.items() if w == "stream"}
    n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
    assert n_lin and n_full
    expected = {**{n: cfg.n_layers for n in EVERY_LAYER}, **{n: n_lin for n in LINEAR},
                **{n: n_full for n in FULL}, "final norm, LM head": 1}
    for name, calls in expected.items():
        assert stream[name]["calls"] == calls, name
    for name in GROUPS:
        assert stream[name]["calls"] >= cfg.n_layers
    # the budget streams every expert; chunks past the ring are waited for, arrived ones are not
    assert set(stream) - {"copy wait"} == set(expected) | set(GROUPS)
    for name in HOST:
        assert rows["host", name]["calls"] == cfg.n_layers
    idle = rows["gap", IDLE]
    assert idle["calls"] == sum(r["calls"] for r in stream.values()) - 1

    covered = sum(r["share"] for r in report["phases"] if r["where"] != "host")
    assert report["span_s"] > 0 and abs(covered - 1) < 0.05
    for name, r in stream.items():
        assert r["seconds"] >= 0 and np.isclose(r["share"], r["seconds"] / report["span_s"])
        assert (r["tflops"] is not None) == (name in GEMMS), name
        if r["tflops"] is not None:
            assert np.isclose(r["tflops"] * 1e12, r["flops"] / r["seconds"])
    H, V = cfg.hidden_size, cfg.vocab_size
    assert stream["final norm, LM head"]["flops"] == 2 * H * V
    assert stream["router GEMM"]["flops"] == 2 * T * H * cfg.n_experts * cfg.n_layers
    # every routed row goes through gate, up and down once
    assert stream["expert gate/up"]["flops"] == 2 * stream["expert down"]["flops"] == \
        2 * 2 * T * cfg.n_experts_used * H * cfg.expert_ffn * cfg.n_layers
    table = "\n".join(phase_lines(report))
    assert "deltanet chunk prep and scan" in table and f"(host) {HOST[0]}" in table and IDLE in table


def test_the_bench_reports_the_phases_of_each_prompt(tiny, emulated, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "bench.json"
    assert prefill_bench.main(bench_args(tiny, "--phases", "--out", str(out))) == 0
    text = capsys.readouterr().out
    assert text.count("phases over a compute span of") == len(prefill_bench.parse(bench_args(tiny)).prompts)
    fig = json.loads(out.read_text())
    for run in fig["runs"]:
        names = {r["name"] for r in run["phases"]["phases"]}
        assert {"deltanet chunk prep and scan", "attention kernel", "expert down", IDLE} <= names


def test_without_phases_no_clock_runs_and_the_bench_json_has_none(tiny, emulated, tmp_path):  # noqa: F811
    backend = cuda_backend.CUDABackend(GGUFModel(tiny), vram_budget=streamed_budget(tiny), pass_tokens=T,
                                       max_context=T)
    assert backend.runner.clock is NULL_CLOCK
    backend.close()
    out = tmp_path / "bench.json"
    assert prefill_bench.main(bench_args(tiny, "--out", str(out))) == 0
    assert all("phases" not in run for run in json.loads(out.read_text())["runs"])


@pytest.mark.parametrize("flag", [["--phases"], []])
def test_the_command_line_passes_phases_through(tiny, emulated, tmp_path, monkeypatch, flag):  # noqa: F811
    from typer.testing import CliRunner

    from fermium.cli import app
    real = prefill_bench.pinned_bandwidth
    monkeypatch.setattr(prefill_bench, "pinned_bandwidth", lambda cuda, nbytes: real(cuda, 1 << 20))
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "prefill", "--model", str(tiny), "--budget", str(streamed_budget(tiny)),
                                   "--prompt", "40", *flag, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert ("phases" in json.loads(out.read_text())["runs"][0]) == bool(flag)
