"""Bad input to the `fermium` command is one line on stderr and exit status 2, not a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def fermium(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fermium", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture
def not_gguf(tmp_path) -> Path:
    path = tmp_path / "notes.gguf"
    path.write_text("not a model\n")
    return path


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench", "decode", "--tokens", "1"]],
                         ids=lambda c: " ".join(c[:2]))
def test_a_file_that_is_not_gguf_is_named_in_one_line(command, not_gguf):
    proc = fermium(*command, "--model", str(not_gguf))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: not a readable GGUF file: {not_gguf}: not a GGUF file (bad magic)"]


def test_an_unknown_isa_in_the_environment_lists_the_known_ones(not_gguf):
    proc = fermium("bench", "decode", "--model", str(not_gguf), env={"FERMIUM_ISA": "neon"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown ISA 'neon'; choose one of generic, ssse3, avx2, avx512, avx512vbmi"


def test_the_console_script_runs_the_same_entry_point():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fermium"] == "fermium.cli:main"


def test_a_stack_whose_services_cannot_load_the_model_stops_with_their_reasons(not_gguf):
    proc = fermium("up", "--model", str(not_gguf), "--port", "0", "--ready-timeout", "60")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"error: not a readable GGUF file: {not_gguf}: not a GGUF file (bad magic)" in lines
    assert lines[-1].startswith("error: the stack did not start: ") and "exited with code 2" in lines[-1]


def test_chat_without_a_router_says_so_in_one_line():
    import socket
    with socket.socket() as s:   # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = fermium("chat", "hello", "--url", f"http://127.0.0.1:{port}")
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith(f"error: cannot reach the router at http://127.0.0.1:{port}: ")
    assert "Traceback" not in proc.stderr


def test_a_backend_this_machine_cannot_run_says_why():
    from common.engines import PREFILL, available
    if available(PREFILL)["cuda"][0]:
        pytest.skip("this machine runs the cuda backend")
    proc = fermium("prefill", "--backend", "cuda", "--ready-timeout", "1")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: prefill backend 'cuda' is not available here: ")


def test_every_setting_is_an_option_with_its_variable_default_and_unit(monkeypatch):
    import typer.main

    from common.config import settings
    from fermium.cli import app
    from fermium.options import config
    from services.decode.config import DecodeConfig
    from services.prefill.config import PrefillConfig
    from services.router.config import RouterConfig
    group = typer.main.get_command(app)
    for name, cls in (("router", RouterConfig), ("prefill", PrefillConfig), ("decode", DecodeConfig)):
        params = {p.name: p for p in group.commands[name].params}
        for field in settings(cls).values():
            p = params[field.name]
            envvars = [p.envvar] if isinstance(p.envvar, str) else p.envvar
            assert f"--{field.name.replace('_', '-')}" in p.opts and f"FERMIUM_{field.name.upper()}" in envvars
    monkeypatch.setenv("FERMIUM_ENGINE", "reference")          # the runner's name before runners were named
    monkeypatch.setenv("FERMIUM_SNAPSHOT_BUDGET", "0.5")
    assert group.commands["decode"].make_context("decode", []).params["runner"] == "reference"
    values = group.commands["router"].make_context("router", ["--no-preserve-thinking"]).params
    assert config(RouterConfig, values, model="m") == RouterConfig("m", snapshot_budget=1 << 29,
                                                                   preserve_thinking=False)
    values = group.commands["prefill"].make_context("prefill", ["--backend", "cuda", "--vram-budget", "2"]).params
    assert config(PrefillConfig, values, model="m").backend_kwargs() == {"device": 0, "vram_budget": 2 << 30}
