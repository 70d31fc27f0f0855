"""The `fermium` command: one typer app; each concern registers its commands here."""
from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Fermium: serve Qwen3.6 hybrid MoE models on old hardware.")
from fermium.cli_generate import generate_command  # noqa: E402

app.command("generate")(generate_command)
