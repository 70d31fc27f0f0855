"""`fermium bench prefill`: the cuda prefill backend at the real 35B widths, on a synthetic model
or, with --model, on a qwen35moe or qwen35 GGUF file with its streamed weights staged as serving does."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fermium.cli_bench import bench_app


@bench_app.command("prefill")
def prefill_bench_command(
    budget: str = typer.Option("6GiB", help="VRAM budget, e.g. 6GiB."),
    prompt: List[int] = typer.Option([947, 4096], help="Prompt lengths to time (repeat the option)."),
    model: Optional[Path] = typer.Option(None, help="A qwen35moe or qwen35 GGUF file; the synthetic model without it."),
    layers: Optional[int] = typer.Option(None, min=1, help="Layers of the synthetic model (40, the real depth)."),
    staging: str = typer.Option("auto", help="How streamed experts reach page-locked memory: auto, register, copy."),
    compare_staging: bool = typer.Option(False, help="With --model: time staging by copy and by register too."),
    phases: bool = typer.Option(False, help="Time each phase of each layer (CUDA events): seconds, share, TFLOP/s."),
    out: Optional[Path] = typer.Option(None, help="Write the figures as JSON here."),
):
    """Prompt tok/s, H2D GB/s against pinned, overlap ratio, achieved TFLOP/s against the device's fp32
    peak (SMs x fp32 lanes x 2 x clock), peak device memory, C2075 estimate; with --model, the seconds
    and GB/s of staging its streamed experts; with --phases, where each prompt's compute time goes."""
    from native.cuda.staging import STAGINGS
    if staging not in STAGINGS:
        typer.echo(f"--staging {staging!r}: choose one of {', '.join(STAGINGS)}", err=True)
        raise typer.Exit(2)
    if model is not None:                     # a bad file is named before any GPU check
        from fermium.prefill_bench_file import BenchModelError, open_model
        try:
            open_model(model)
        except BenchModelError as exc:
            typer.echo(f"fermium bench prefill: {exc}", err=True)
            raise typer.Exit(2) from None
    from services.prefill.backends.cuda import CUDABackend
    ok, why = CUDABackend.availability()
    if not ok:
        typer.echo(f"the cuda prefill backend is unavailable here: {why}", err=True)
        raise typer.Exit(2)
    from fermium.prefill_bench import main
    args = ["--budget", budget, "--prompts", *map(str, prompt), "--staging", staging]
    args += ["--model", str(model)] if model else []
    args += ["--layers", str(layers)] if layers else []
    args += ["--compare-staging"] if compare_staging else []
    args += ["--phases"] if phases else []
    raise typer.Exit(main(args + (["--out", str(out)] if out else [])))
