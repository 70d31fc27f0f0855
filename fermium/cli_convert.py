"""`fermium convert`: a Hugging Face safetensors checkpoint to a GGUF file."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from common.errors import EXIT_BAD_INPUT
from common.model.convert import FILE_TYPES, ConvertError, convert
from common.model.convert.mmproj import MMPROJ_TYPES, convert_mmproj


def convert_command(
    src_dir: Path = typer.Argument(..., help="Checkpoint directory (config.json + *.safetensors)."),
    out: Path = typer.Argument(..., help="GGUF file to write."),
    out_type: str = typer.Option("f16", "--type", help=f"Output type: {', '.join(FILE_TYPES)}."),
    name: Optional[str] = typer.Option(None, help="general.name (default: the directory name)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    no_mtp: bool = typer.Option(False, "--no-mtp", help="Leave out the MTP block (mtp.*), as llama.cpp's --no-mtp."),
    mmproj: Optional[Path] = typer.Option(None, "--mmproj", help="Also write the vision tower (model.visual.*) "
                                          "to this file, as llama.cpp's --mmproj writes it."),
    mmproj_type: str = typer.Option("f16", "--mmproj-type", help=f"The mmproj's type: {', '.join(MMPROJ_TYPES)}."),
):
    """Convert a qwen3_5_moe / qwen3_5_moe_text / qwen3_next checkpoint to llama.cpp's GGUF."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        if mmproj is not None and mmproj_type not in MMPROJ_TYPES:
            raise ConvertError("--mmproj-type", f"choose one of {', '.join(MMPROJ_TYPES)}, not {mmproj_type!r}")
        results = [convert(src_dir, out, out_type, progress=not quiet, name=name, mtp=not no_mtp)]
        if mmproj is not None:
            results.append(convert_mmproj(src_dir, mmproj, mmproj_type, progress=not quiet, name=name))
    except ConvertError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    for result in results:
        types = ", ".join(f"{n} {k}" for k, n in sorted(result.types.items()))
        typer.echo(f"wrote {result.path} ({result.arch}, {result.n_tensors} tensors: {types}; "
                   f"{result.nbytes / 2**20:.1f} MiB)")
