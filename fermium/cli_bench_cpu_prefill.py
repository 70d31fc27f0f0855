"""`fermium bench cpu-prefill`: the prompt through the CPU runner, as the prefill
service's cpu backend runs it, against the same prompt decoded one token at a time."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Optional

import typer

from fermium.bench_runner import command_line, kv_type_option, native_runner
from fermium.cli_bench import bench_app


def _prompt(vocab: int, n: int) -> list[int]:
    return [(i * 7919 + 13) % vocab for i in range(n)]


@bench_app.command("cpu-prefill")
def cpu_prefill_command(
    model: Path = typer.Option(..., exists=True, dir_okay=False, help="GGUF model file."),
    prompt: int = typer.Option(256, min=1, help="Prompt tokens."),
    chunk: Optional[int] = typer.Option(None, min=1, help="Prompt tokens per native step (default: the runner's, "
                                                          "as the cpu backend runs it)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Threads (default: one per physical core)."),
    isa: Optional[str] = typer.Option(None, help="Force generic, ssse3, avx2, avx512 or avx512vbmi "
                                                 "(default: the best)."),
    kv_type: str = kv_type_option(),
    rounds: int = typer.Option(3, min=1, help="Timed prefills."),
    baseline_tokens: int = typer.Option(16, min=0, help="Tokens decoded one at a time for the baseline (0: none)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Prompt tok/s of the chunked native prefill, and its ratio to token-by-token decoding."""
    from native.cpu_prefill import NATIVE_CHUNK

    command = command_line()
    runner = native_runner(model, threads, isa, kv_type=kv_type)
    chunk = chunk or NATIVE_CHUNK
    ids = _prompt(runner.cfg.vocab_size, prompt)
    runner.prefill(ids[:min(prompt, chunk)], runner.new_state(), chunk=chunk)   # warms pages and pool
    rates = []
    for _ in range(rounds):
        state = runner.new_state()
        t0 = time.perf_counter()
        runner.prefill(ids, state, chunk=chunk)
        rates.append(prompt / (time.perf_counter() - t0))
    report = {"command": command, "model": str(model), "isa": runner.isa, "threads": runner.threads,
              "prompt": prompt, "chunk": chunk, "kv_type": kv_type,
              "prompt_tok_s": rates, "median_prompt_tok_s": statistics.median(rates),
              "weights_gb_per_chunk": runner.last_bytes / 1e9 / -(-prompt // chunk)}
    if baseline_tokens:
        state = runner.new_state()
        t0 = time.perf_counter()
        for t in ids[:baseline_tokens]:
            runner.decode([t], [state])
        report["token_by_token_tok_s"] = baseline_tokens / (time.perf_counter() - t0)
        report["speedup"] = report["median_prompt_tok_s"] / report["token_by_token_tok_s"]
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"$ {command}")
    typer.echo(f"model {model.name}  isa {runner.isa}  threads {runner.threads}  prompt {prompt}  chunk {chunk}  "
               f"KV {kv_type}")
    typer.echo("prompt tok/s by round: " + " ".join(f"{r:.1f}" for r in rates)
               + f"; median {report['median_prompt_tok_s']:.1f}"
               f"; {report['weights_gb_per_chunk']:.3f} GB of weights per chunk")
    if baseline_tokens:
        typer.echo(f"token by token: {report['token_by_token_tok_s']:.1f} tok/s; "
                   f"chunked prefill {report['speedup']:.1f}x that")
