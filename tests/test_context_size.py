"""--ctx-size: one setting of router, prefill and decode (alias --max-model-len), bounded by the
model's context_length, and refused at start when the sequences it allows cannot fit the RAM."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from starlette.testclient import TestClient
from typer.testing import CliRunner

import common.config as config_module
from common.config import ContextModel, ContextSizeError, check_memory, context_size
from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from common.sequence_memory import sequence_memory
from common.state import check_state
from fermium.options import command, config, options
from services.decode.config import DecodeConfig
from services.decode.server import DecodeServer
from services.prefill.config import PrefillConfig
from services.router.config import RouterConfig
from services.router.server import build_router
from tests.stack_helpers import write_tiny_gguf

REPO = Path(__file__).resolve().parent.parent
CONTEXT = 512                 # the tiny model's context_length
MIB = 2 ** 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("ctx") / "tiny.gguf", context=CONTEXT)


@pytest.fixture(scope="module")
def model(tiny) -> GGUFModel:
    return GGUFModel(tiny)


@pytest.mark.parametrize("cls", [RouterConfig, PrefillConfig, DecodeConfig])
@pytest.mark.parametrize("spelled", [["--ctx-size", "300"], ["--max-model-len", "300"]])
def test_the_option_has_its_env_var_and_the_old_name_as_alias(cls, spelled):
    seen = {}

    @command(options(cls, "ctx_size"))
    def show(**settings):
        seen.update(ctx=config(cls, settings, model="m").ctx_size)

    app = typer.Typer()
    app.command()(show)
    runner = CliRunner()
    assert runner.invoke(app, spelled).exit_code == 0 and seen["ctx"] == 300
    for env in ("FERMIUM_CTX_SIZE", "FERMIUM_MAX_MODEL_LEN"):
        assert runner.invoke(app, [], env={env: "200"}).exit_code == 0 and seen["ctx"] == 200
    assert runner.invoke(app, []).exit_code == 0 and seen["ctx"] == 0      # 0: the model's


def test_a_ctx_size_beyond_the_model_is_refused(model):
    assert context_size(0, model.config) == CONTEXT
    assert context_size(100, model.config) == 100
    with pytest.raises(ContextSizeError, match=f"--ctx-size {CONTEXT + 1} is beyond this model's context_length "
                                               f"of {CONTEXT} tokens; give at most {CONTEXT}"):
        context_size(CONTEXT + 1, model.config)


def test_a_worker_given_too_long_a_context_exits_with_one_line(tiny):
    proc = subprocess.run([sys.executable, "-m", "fermium", "decode", "--model", str(tiny), "--ctx-size", "262144"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FERMIUM_WORKER_TOKEN": "t"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --ctx-size 262144 is beyond this model's context_length of {CONTEXT} tokens; "
        f"give at most {CONTEXT} (0 is the model's)"]


@pytest.mark.parametrize("tokens", [1, 37, 300, CONTEXT])
def test_the_estimate_is_the_state_that_the_runner_holds_there(model, tokens):
    runner = ReferenceModel(model)
    state = runner.new_state()
    runner.prefill([(7 * t) % model.config.vocab_size for t in range(tokens)], state)
    mem = sequence_memory(model.config, tokens)
    assert state.pos == tokens
    assert mem.total_bytes == state.nbytes
    assert mem.kv_bytes == sum(a.nbytes for a in state.k + state.v)
    assert mem.recurrent_bytes == sequence_memory(model.config, 0).total_bytes == runner.new_state().nbytes
    assert f"context {tokens} tokens: up to " in mem.describe(4) and "batch of 4: " in mem.describe(4)


def test_the_worker_checks_states_against_its_context(model):
    view = ContextModel(model, 64)
    assert view.config.context_length == 64 and view.path == model.path
    check_state(64, sequence_state_arrays(model, 64), view.config)
    with pytest.raises(ValueError, match=r"outside \[0, 64\]"):
        check_state(65, sequence_state_arrays(model, 65), view.config)


def sequence_state_arrays(model, pos):
    import numpy as np

    from common.state import state_specs
    return [np.zeros(shape, dtype) for _, dtype, shape in state_specs(pos, model.config)]


def test_a_context_beyond_the_ram_is_refused_naming_the_sizes(model, tiny, monkeypatch, caplog):
    """One sequence at the whole context must fit with the model file: else the start is refused.
    A batch of them is a worst case (KV grows with each sequence), so past the RAM it is a warning.
    The sizes are those of the KV cache type, f16 by default: half the KV bytes of f32."""
    mem = sequence_memory(model.config, CONTEXT, "f16")
    assert 2 * mem.kv_bytes == sequence_memory(model.config, CONTEXT, "f32").kv_bytes
    file_bytes = tiny.stat().st_size
    ram = file_bytes + 4 * mem.total_bytes + mem.total_bytes // 2  # room for 4 sequences of the whole context
    monkeypatch.setattr(config_module, "machine_ram", lambda: (ram, None))
    assert check_memory("decode", mem, 4, file_bytes) == file_bytes + 4 * mem.total_bytes
    with caplog.at_level("WARNING", logger="fermium.config"):
        server = DecodeServer(DecodeConfig(model=str(tiny), max_batch=16, worker_token="t",
                                           listen="tcp://127.0.0.1:0"), model=model,
                              runner=ReferenceModel(model, kv_type="f16"))
        server.close()
    assert "16 sequences at the full context of 512 tokens" in caplog.text and "--max-batch 4 would" in caplog.text
    small = file_bytes + mem.total_bytes // 2                       # not even one sequence of the context
    monkeypatch.setattr(config_module, "machine_ram", lambda: (small, None))
    with pytest.raises(ContextSizeError) as err:
        DecodeServer(DecodeConfig(model=str(tiny), max_batch=16, worker_token="t"), model=model,
                     runner=ReferenceModel(model, kv_type="f16"))
    text = str(err.value)
    assert text.startswith(f"decode: a context of {CONTEXT} tokens needs up to "
                           f"{mem.total_bytes / MIB:.1f} MiB per sequence (KV f16 {mem.kv_bytes / MIB:.1f} MiB + "
                           f"recurrent state {mem.recurrent_bytes / MIB:.1f} MiB)")
    assert f"model file's {file_bytes / MIB:.1f} MiB" in text
    assert f"more than this machine's {small / MIB:.1f} MiB of RAM; lower --ctx-size" in text
    fit = int(text.split("(--ctx-size ")[1].split()[0])
    assert fit * mem.kv_bytes_per_token + mem.recurrent_bytes + file_bytes <= small
    # what it suggests starts
    server = DecodeServer(DecodeConfig(model=str(tiny), max_batch=16, ctx_size=fit, worker_token="t",
                                       listen="tcp://127.0.0.1:0"), model=model,
                          runner=ReferenceModel(model, kv_type="f16"))
    try:
        assert server.model.config.context_length == fit
    finally:
        server.close()

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_router_answers_400_beyond_its_ctx_size(tiny):
    cfg = RouterConfig(model=str(tiny), ctx_size=100, workers=f"tcp://127.0.0.1:{free_port()}", snapshot_budget=0,
                       worker_token="t")
    app, _ = build_router(cfg)
    with TestClient(app) as client:
        models = client.get("/v1/models").json()["data"][0]
        assert models["max_model_len"] == 100
        r = client.post("/v1/completions", json={"model": "fermium", "prompt": list(range(90)), "max_tokens": 20})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert "context limit of 100 tokens" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"model": "fermium", "prompt": list(range(101))})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_the_cuda_plan_refuses_a_context_beyond_the_vram_budget(model):
    from native.cuda.plan import VramBudgetError, make_plan, state_bytes
    sizes = {n: t.nbytes for n, t in model.tensors.items()}
    p = make_plan(model.config, sizes, budget=1 << 40, max_context=1)
    budget = p.dense_bytes + p.workspace_bytes + p.reserve_bytes + 8 * p.expert_bytes + state_bytes(model.config, 200)
    assert make_plan(model.config, sizes, budget=budget, max_context=200).state_bytes == state_bytes(model.config, 200)
    with pytest.raises(VramBudgetError, match=r"state \+ KV for 512 tokens .* raise --vram-budget or lower "
                                              r"--ctx-size \(at most 200 tokens fit this budget\)"):
        make_plan(model.config, sizes, budget=budget, max_context=CONTEXT)
    cfg = PrefillConfig(model="m", backend="cuda", vram_budget=2 << 30)
    assert cfg.backend_kwargs(CONTEXT) == {"device": 0, "vram_budget": 2 << 30}      # the backend's own
    cfg = PrefillConfig(model="m", backend="cuda", vram_budget=2 << 30, ctx_size=CONTEXT)
    assert cfg.backend_kwargs(CONTEXT) == {"device": 0, "vram_budget": 2 << 30, "max_context": CONTEXT}
    assert PrefillConfig(model="m").backend_kwargs(CONTEXT) == {}


def test_the_runner_makes_each_kv_buffer_once_for_the_context(model):
    from native.cpu_runner import CpuRunner
    runner = CpuRunner(model, threads=1, prefault=False, repack=False)
    runner.max_context = 300
    state = runner.new_state()
    runner.prefill(list(range(10, 40)), state)
    bases = [a.base for a in state.k + state.v]
    for step in range(5):
        runner.decode([50 + step], [state])
    assert state.pos == 35
    assert all(a.base is b for a, b in zip(state.k + state.v, bases))          # never copied to grow
    assert all(b.shape[0] == 300 for b in bases)
    assert state.nbytes == sequence_memory(model.config, 35).total_bytes


def test_a_file_larger_than_the_ram_names_the_smaller_files_that_fit(model, tiny, monkeypatch):
    """No context fits beside the file: the refusal names the sizes and the llama-quantize file
    types of this model whose file and one sequence's state would fit, the largest first."""
    from common.file_types import SMALLER_NAMED, file_type_sizes
    from common.sequence_memory import size_text
    from fermium.cli_services import _check_fits
    mem = sequence_memory(model.config, CONTEXT, "f16")
    file_bytes = tiny.stat().st_size
    sizes = file_type_sizes(model)
    q4_k_m = dict((name, n) for name, n, _ in sizes)["q4_k_m"]
    ram = q4_k_m + mem.total_bytes
    assert ram < file_bytes
    monkeypatch.setattr(config_module, "machine_ram", lambda: (ram, None))
    with pytest.raises(ContextSizeError) as err:
        DecodeServer(DecodeConfig(model=str(tiny), max_batch=16, worker_token="t"), model=model,
                     runner=ReferenceModel(model, kv_type="f16"))
    text = str(err.value)
    assert text.startswith(f"decode: a context of {CONTEXT} tokens needs up to {size_text(mem.total_bytes)} per "
                           f"sequence")
    assert f"model file's {size_text(file_bytes)}" in text
    assert f"more than this machine's {size_text(ram)} of RAM" in text
    assert "--ctx-size" not in text
    named = text.split("that would fit, by bits per weight: ")[1].split(", ")
    fits = [(name, n, bpw) for name, n, bpw in sizes if n + mem.total_bytes <= ram]
    assert named == [f"{name.upper()} about {size_text(n)} ({bpw:.2f} bpw)" for name, n, bpw in fits[:SMALLER_NAMED]]
    assert named[0].startswith("Q4_K_M ") and len(named) == SMALLER_NAMED
    # `fermium up` says so before it starts anything
    with pytest.raises(ContextSizeError, match=r"^up: a context of .* files of this model that would fit"):
        _check_fits(str(tiny), 0, "f16")
    smallest, smallest_bytes, _ = sizes[-1]
    tight = smallest_bytes + mem.total_bytes - 1                     # the smallest fits only with less context
    monkeypatch.setattr(config_module, "machine_ram", lambda: (tight, None))
    with pytest.raises(ContextSizeError) as err:
        _check_fits(str(tiny), 0, "f16")
    fit = int(str(err.value).split(f"the smallest, {smallest.upper()}, about {size_text(smallest_bytes)}, "
                                   f"would with --ctx-size ")[1])
    assert 0 < fit < CONTEXT and smallest_bytes + sequence_memory(model.config, fit, "f16").total_bytes <= tight
    monkeypatch.setattr(config_module, "machine_ram", lambda: (smallest_bytes, None))      # not even that
    with pytest.raises(ContextSizeError, match=rf"no llama-quantize file type of this model fits \(the smallest, "
                                               rf"{smallest.upper()}, about "):
        _check_fits(str(tiny), 0, "f16")


def test_the_file_type_sizes_are_those_of_the_files(tmp_path):
    """Priced from an F32 file's tensors, each file type is within 2% of the file written so
    (the synthetic writer keeps the small DeltaNet gates F32, which llama-quantize would not)."""
    import os
    sys.path.insert(0, str(REPO / "tools"))
    from make_synthetic_gguf import TINY, write_synthetic

    from common.file_types import file_type_sizes
    sizes = {name: n for name, n, _ in file_type_sizes(GGUFModel(write_synthetic(tmp_path / "f32.gguf", layers=4,
                                                                                 recipe="f32", widths=TINY)))}
    for recipe in ("q8_0", "q3_k_m", "iq2_xxs", "mxfp4_moe"):
        real = os.path.getsize(write_synthetic(tmp_path / f"{recipe}.gguf", layers=4, recipe=recipe, widths=TINY))
        assert abs(sizes[recipe] - real) <= 0.02 * real, recipe
