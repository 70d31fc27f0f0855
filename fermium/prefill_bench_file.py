"""The real path of `fermium bench prefill --model FILE`: the file checked before any GPU work,
and the cost of staging its streamed experts into page-locked host memory, by one way or both.
"""
from __future__ import annotations

from pathlib import Path

from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from native.cuda.staging import HostExperts

ARCH = "qwen35moe"


class BenchModelError(Exception):
    """A --model the benchmark cannot run; the message names the file and the problem."""


def open_model(path: str | Path) -> GGUFModel:
    path = Path(path)
    try:
        model = GGUFModel(path)
        arch = model.config.arch
    except FileNotFoundError:
        raise BenchModelError(f"{path}: no such file") from None
    except (ModelConfigError, OSError, ValueError) as exc:
        raise BenchModelError(f"{path}: not a model file the benchmark can run: {exc}") from None
    if arch != ARCH:
        raise BenchModelError(f"{path}: architecture {arch!r}; the benchmark runs {ARCH} files "
                              f"(Qwen3.5/3.6 MoE)")
    return model


def staging_figures(host: HostExperts) -> dict:
    return {"method": host.method, "seconds": host.seconds, "bytes": host.nbytes,
            "gb_per_s": host.rate / 1e9}


def staging_line(what: str, fig: dict) -> str:
    return (f"{what}: {fig['bytes'] / 2**30:.2f} GiB of streamed experts staged by {fig['method']} "
            f"in {fig['seconds']:.2f} s = {fig['gb_per_s']:.2f} GB/s")


def compare_staging(cuda, backend, model) -> dict:
    """Stage the backend's streamed experts again by copy and by register, one after the other
    (the file's pages already read once, by the backend's own staging), each freed before the next."""
    out = {}
    backend.ctx.push()
    try:
        for how in ("copy", "register"):
            try:
                host = HostExperts(cuda, model, backend.plan, how)
            except RuntimeError as exc:                  # the driver refused this way
                out[how] = {"method": how, "refused": str(exc)}
                continue
            out[how] = staging_figures(host)
            host.release()
    finally:
        backend.ctx.pop()
    if "seconds" in out["copy"] and "seconds" in out["register"]:
        out["copy_over_register"] = out["copy"]["seconds"] / max(out["register"]["seconds"], 1e-9)
    return out


def compare_lines(cmp: dict) -> list[str]:
    lines = [f"staging by {how} refused: {fig['refused']}" if "refused" in fig else staging_line(f"staging={how}", fig)
             for how, fig in ((h, cmp[h]) for h in ("copy", "register"))]
    if "copy_over_register" in cmp:
        lines.append(f"copy / register staging time: {cmp['copy_over_register']:.2f}")
    return lines
