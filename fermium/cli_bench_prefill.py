"""`fermium bench prefill`: the cuda prefill backend at the real 35B widths on a synthetic model."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from fermium.cli_bench import bench_app


@bench_app.command("prefill")
def prefill_bench_command(
    budget: str = typer.Option("6GiB", help="VRAM budget, e.g. 6GiB."),
    prompt: List[int] = typer.Option([947, 4096], help="Prompt lengths to time (repeat the option)."),
    layers: int = typer.Option(40, min=1, help="Layers of the synthetic model (40 is the real depth)."),
    out: Optional[Path] = typer.Option(None, help="Write the figures as JSON here."),
):
    """Prompt tok/s, H2D GB/s against pinned, overlap ratio, achieved TFLOP/s against the device's fp32
    peak (SMs x fp32 lanes x 2 x clock), peak device memory, C2075 estimate."""
    from services.prefill.backends.cuda import CUDABackend
    ok, why = CUDABackend.availability()
    if not ok:
        typer.echo(f"the cuda prefill backend is unavailable here: {why}", err=True)
        raise typer.Exit(2)
    repo = Path(__file__).resolve().parents[1]
    if not (repo / "tools" / "cuda_bench.py").exists():
        typer.echo("fermium bench prefill runs tools/cuda_bench.py of a source checkout; none here", err=True)
        raise typer.Exit(2)
    sys.path.insert(0, str(repo))
    from tools.cuda_bench import main
    args = ["--budget", budget, "--layers", str(layers), "--prompts", *map(str, prompt)]
    raise typer.Exit(main(args + (["--out", str(out)] if out else [])))
