"""The `fermium` command: one typer app; each concern registers its commands here."""
from __future__ import annotations

import typer

from common.errors import EXIT_BAD_INPUT, UserError

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Fermium: serve Qwen3.6 hybrid MoE models on old hardware.")
from fermium.cli_generate import generate_command  # noqa: E402

app.command("generate")(generate_command)
from fermium.cli_services import chat_command, decode_command, demo_command, prefill_command, router_command, up_command  # noqa: E402

for _name, _cmd in {"router": router_command, "prefill": prefill_command, "decode": decode_command,
                    "up": up_command, "chat": chat_command, "demo": demo_command}.items():
    app.command(_name)(_cmd)
from fermium.cli_convert import convert_command  # noqa: E402

app.command("convert")(convert_command)
from fermium.cli_deploy import deploy_app, keys_app  # noqa: E402

app.add_typer(keys_app, name="keys")
app.add_typer(deploy_app, name="deploy")
from fermium.cli_bench import bench_app  # noqa: E402

app.add_typer(bench_app, name="bench")
from fermium import (  # noqa: E402  (imported after `app` exists: importing them registers their commands)
    cli_bench_cpu_prefill,  # noqa: F401  (registers `fermium bench cpu-prefill`)
    cli_bench_prefill,  # noqa: F401  (registers `fermium bench prefill`)
)


def main() -> None:
    """The console entry point: an error in what the user gave (common/errors.py) is one line on
    stderr and exit status 2, not a traceback."""
    try:
        app()
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
