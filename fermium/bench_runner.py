"""What the `fermium bench` commands share: the CPU runner loaded as serving loads it, every
sequence's context filled before timing, the --kv-type option and the command line of the report."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from common.kv_cache import DEFAULT_KV_TYPE, KV_TYPES, check_kv_type

WARMUP_STEPS = 2   # decode steps before timing, the last of the context (the page cache and the pool warm)


def kv_type_option() -> typer.models.OptionInfo:
    return typer.Option(DEFAULT_KV_TYPE, envvar="FERMIUM_KV_TYPE", help=f"KV cache type: {', '.join(KV_TYPES)}.")


def command_line() -> str:
    """The command as typed, for the report."""
    return "fermium " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def native_runner(model: Path, threads: Optional[int], isa: Optional[str], **options):
    """The CPU runner on `model`; an ISA this CPU lacks is a usage error on --isa."""
    from common.engines import load_runner
    from common.model.gguf_file import GGUFModel
    from native import cpu_lib
    check_kv_type(options.get("kv_type", DEFAULT_KV_TYPE))     # a bad name fails before the model loads
    try:
        return load_runner("native", GGUFModel(model), threads=threads, isa=isa, **options)[1]
    except cpu_lib.IsaError as exc:
        raise typer.BadParameter(str(exc), param_hint="--isa") from exc


def fill_context(runner, states: list, tokens: int) -> float:
    """Bring every state to `tokens` positions of context, as `llama-bench -d` does: one prefill
    (weights read once per chunk) whose state every sequence starts from. Decoding the context a
    token at a time instead reads all the weights once per token and attends over a growing cache:
    at 32,768 tokens about half an hour before timing began. Returns the seconds it took."""
    if tokens <= 0 or not states:
        return 0.0
    t0 = time.perf_counter()
    runner.prefill([(t * 31 + 11) % runner.cfg.vocab_size for t in range(tokens)], states[0])
    for s in states[1:]:
        filled = states[0].copy()
        s.pos, s.conv, s.ssm, s.k, s.v = filled.pos, filled.conv, filled.ssm, filled.k, filled.v
    return time.perf_counter() - t0
