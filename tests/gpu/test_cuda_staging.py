"""Staging of the streamed experts on a GPU: registered anonymous memory read from the file, and
page-locked copies, hold the file's bytes and give the reference's prefill; and
`fermium bench prefill --model` runs a tiny file end to end with both ways timed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.state import SequenceState
from fermium import prefill_bench
from native.cuda.plan import EXPERT_TENSORS
from services.prefill.backends.cuda import CUDABackend

from .test_cuda_parity import LOGITS_REL, budget, reference, rel_err
from .tiny_gguf import TinySpec, build

SAME_REL = 1e-5       # the two ways copy the same bytes; only the kernels' own order may differ


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return GGUFModel(build(tmp_path_factory.mktemp("m") / "qwen35moe-kquants.gguf", TinySpec()))


def test_register_and_copy_hold_the_files_bytes_and_give_the_reference_prefill(model):
    tokens = list(np.random.default_rng(5).integers(0, model.config.vocab_size, 90))
    split = 60
    _, want, _ = reference(model, tokens, split)
    got = {}
    for how in ("register", "copy"):
        backend = CUDABackend(model, vram_budget=budget(model, 0.0, 64), pass_tokens=64, max_context=512,
                              staging=how)
        try:
            host = backend.host
            assert host.method == how and host.pinned and host.nbytes > 0
            P = backend.plan.pinned_experts
            for i in range(model.config.n_layers):
                for t in EXPERT_TENSORS:
                    assert np.array_equal(host.src[(i, t)], model.tensor(f"blk.{i}.{t}.weight").raw[P:])
            st = SequenceState.empty(model.config)
            got[how] = [backend.prefill(tokens[:split], st), backend.prefill(tokens[split:], st)]
            assert backend.stats()["h2d_bytes"] > 0
        finally:
            backend.close()
    for w, r, c in zip(want, got["register"], got["copy"]):
        assert rel_err(r, w) < LOGITS_REL and rel_err(c, r) < SAME_REL


def test_the_bench_runs_a_gguf_file(model, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--model", str(model.path), "--budget", str(budget(model, 0.0, 128)), "--prompts", "64", "128",
            "--compare-staging", "--out", str(out)]
    assert prefill_bench.main(args) == 0
    text = capsys.readouterr().out
    assert "copy / register staging time:" in text and "% of fp32 peak" in text
    fig = json.loads(out.read_text())
    assert fig["staging"]["method"] == "register" and all(r["logits_finite"] for r in fig["runs"])
    assert fig["staging_compared"]["copy"]["bytes"] == fig["staging_compared"]["register"]["bytes"] > 0
