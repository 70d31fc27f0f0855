"""`fermium bench decode`: native decode speed against this machine's memory bandwidth.

The bandwidth (a streaming sum with the same threads over a buffer several times the last-level
cache) is measured after every decode step, in the same process, and a round is compared with
the bytes those streams read over the time they took: on a shared machine whose bandwidth drifts,
the streams meet the load the decode met, where a best-of-several figure would sit above it.
"""
from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from common.kv_cache import DEFAULT_KV_TYPE, KV_TYPES, check_kv_type

WARMUP_STEPS = 2   # decode steps before timing, the last of the context (the page cache and the pool warm)
bench_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Benchmarks.")


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


def _round(runner, runs: list[list], tokens: int, probe, prefetch: bool) -> tuple[list[dict], float]:
    """`tokens` decode steps of each batch of states in `runs`, taking turns step by step, and a
    bandwidth stream (of the kind given) after each step, so that all of them meet the same noise
    from the rest of the machine. Per run, its wall time, bytes, Python share and phases; and the
    bandwidth over the round (bytes streamed over the time they took). One stream per step, not
    the best of several: a maximum of short noisy samples would overstate the bandwidth."""
    out = [{"seconds": 0.0, "steps": tokens, "total": 0.0, "c_time": 0.0, "phases": {}} for _ in runs]
    bw_seconds = 0.0
    for step in range(tokens):
        for states, r in zip(runs, out):
            t0 = time.perf_counter()
            runner.decode([(step * 7919 + b * 104729) % runner.cfg.vocab_size for b in range(len(states))], states)
            r["seconds"] += time.perf_counter() - t0
            r["total"] += runner.last_seconds[0]
            r["c_time"] += runner.last_seconds[1]
            r["step_bytes"] = runner.last_bytes
            for name, (sec, nbytes) in runner.last_phases().items():
                acc = r["phases"].setdefault(name, [0.0, 0.0])
                acc[0] += sec / tokens
                acc[1] += nbytes / tokens
        bw_seconds += probe.nbytes / probe.stream(prefetch)
    for r in out:
        total, c_time = r.pop("total"), r.pop("c_time")
        r["python_share"] = (total - c_time) / total
    return out, tokens * probe.nbytes / bw_seconds


LLC_MULTIPLE = 4   # a stream this many times the last-level cache reads from memory, not the cache


def probe_mib(llc: int | None) -> int:
    """The bandwidth buffer, MiB: LLC_MULTIPLE times the last-level cache in whole 2 MB pages, at
    least 256 MiB and at most an eighth of the RAM (a 300 MiB cache would otherwise serve part of
    a 256 MiB stream, and the ratio would be taken against a cache's speed)."""
    from common.model.huge_pages import HUGE_PAGE
    from native import cpu_lib

    want = max(256 << 20, -(-LLC_MULTIPLE * (llc or 0) // HUGE_PAGE) * HUGE_PAGE)
    cap = cpu_lib.ram_bytes() // 8 // HUGE_PAGE * HUGE_PAGE
    return max(64 << 20, min(want, cap)) >> 20


def cache_resident_note(step_bytes: int, llc: int | None) -> str | None:
    """A warning where a step reads less than LLC_MULTIPLE times the last-level cache: part of the
    weights may then come from the cache, and the share of bandwidth can read high (even above
    100%). None where the step is large enough or the cache size is unknown."""
    if not llc or step_bytes >= LLC_MULTIPLE * llc:
        return None
    return (f"a step reads {step_bytes / 2**20:.0f} MiB, less than {LLC_MULTIPLE}x this CPU's "
            f"{llc / 2**20:.0f} MiB last-level cache: part of the weights may come from the cache and the "
            "share of bandwidth read high; a model with more layers (tools/make_synthetic_gguf.py "
            "--layers) keeps it honest")


def _huge_page_shares(runner) -> dict[str, float | None]:
    """How much of each weight mapping (the GGUF, the repack cache) is in 2 MB pages: a TLB miss
    every 4 KB costs scattered expert reads a few percent on some hosts."""
    from common.model.huge_pages import huge_page_share

    shares = {"model file": huge_page_share(runner.model.file.data.ctypes.data)}
    if runner.repacked:
        shares["repack cache"] = huge_page_share(next(iter(runner.repacked.views.values())).ctypes.data)
    return shares


def resident_memory(runner, model: Path, sequences: int) -> dict:
    """This process's resident bytes now (VmRSS) against what it should hold: the model file and the
    KV of `sequences` states at the runner's context size. The recurrent states are a few MiB."""
    from common.config import sequence_memory
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    rss = int(status["VmRSS"].split()[0]) * 1024
    kv = sequences * sequence_memory(runner.cfg, runner.max_context, runner.kv_type).kv_bytes
    file_bytes = model.stat().st_size
    return {"rss_bytes": rss, "model_file_bytes": file_bytes, "kv_bytes": kv,
            "rss_over_file_kv": rss / (file_bytes + kv)}


def _phase_table(rounds: list[dict]) -> list[str]:
    """Per phase, the median round's ms per step, GB per step and GB/s; then the serial rest."""
    lines = [f"{'phase':16s} {'ms/step':>8s} {'GB/step':>8s} {'GB/s':>6s} {'share':>6s}"]
    median = sorted(rounds, key=lambda x: x["step_ms"])[len(rounds) // 2]
    step_s = median["phases"]["step"][0]
    rest = step_s
    for name, (sec, nbytes) in median["phases"].items():
        if name == "step":
            continue
        rest -= sec
        lines.append(f"{name:16s} {1e3 * sec:8.2f} {nbytes / 1e9:8.3f} {nbytes / sec / 1e9 if sec else 0:6.2f} "
                     f"{100 * sec / step_s:5.1f}%")
    lines.append(f"{'the rest':16s} {1e3 * rest:8.2f} {'':8s} {'':6s} {100 * rest / step_s:5.1f}%  "
                 "(serial: norms, matvec input quantization, embedding)")
    return lines


@bench_app.command("decode")
def decode_command(
    model: Path = typer.Option(..., exists=True, dir_okay=False, help="GGUF model file."),
    threads: Optional[int] = typer.Option(None, min=1, help="Threads (default: one per physical core)."),
    batch: int = typer.Option(1, min=1, help="Sequences decoded together."),
    isa: Optional[str] = typer.Option(None, help="Force generic, ssse3, avx2 or avx512 (default: the best)."),
    tokens: int = typer.Option(16, min=1, help="Decode steps per round."),
    rounds: int = typer.Option(3, min=1, help="Rounds of decode steps, each step followed by a bandwidth "
                                              "measurement; with --batch, a round's steps alternate with "
                                              "those of one sequence."),
    context: int = typer.Option(16, min=0, help="Tokens of context each sequence holds before timing."),
    kv_type: str = kv_type_option(),
    bw_mib: Optional[int] = typer.Option(None, min=64, help="Buffer for the bandwidth measurement after each "
                                                           "step, MiB (default: 4 x the last-level cache, at "
                                                           "least 256)."),
    prefault: bool = typer.Option(True, help="Map every page of the model before timing (as serving does)."),
    repack: bool = typer.Option(True, help="Read the matrices this ISA reads faster repacked from the cache "
                                           "beside the model (built on first use), as serving does."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    show_phases: bool = typer.Option(False, "--phases", help="Also print where a step's time goes."),
    speculative: str = typer.Option("none", help="none, or mtp: time the speculative cycle (MTP drafts, one "
                                                 "verify of 1 + k rows per sequence, rollback) against plain "
                                                 "decode in alternating rounds; needs a file with an MTP block."),
    draft_tokens: int = typer.Option(2, min=1, help="With --speculative mtp: tokens drafted a cycle, 1 to 3."),
    accept_rate: float = typer.Option(0.7, min=0.0, max=1.0, help="With --speculative mtp: the probability that "
                                      "each draft is accepted, up to the first refusal (forced, from a fixed seed: "
                                      "random weights accept nothing)."),
    draft_vocab: int = typer.Option(0, min=0, help="With --speculative mtp: the draft LM head's vocabulary "
                                                   "(0: the whole; N: the N lowest ids and the special tokens)."),
):
    """Decode tok/s, weight GB read per token, effective GB/s and its share of measured bandwidth;
    with --speculative mtp, speculative decode's tok/s against plain decode's."""
    from native import cpu_lib

    command = command_line()
    if speculative != "none":
        from fermium.cli_bench_spec import speculative_command
        speculative_command(command, model, threads, isa, prefault, repack, kv_type, batch, tokens, rounds, context,
                            speculative, draft_tokens, accept_rate, draft_vocab, as_json)
        return
    runner = native_runner(model, threads, isa, prefault=prefault, repack=repack, kv_type=kv_type)
    # KV buffers made for the whole run, as the decode server makes them for its context size: no
    # timed step copies a cache to grow it (at 32,768 tokens one such copy cost more than 10 steps)
    runner.max_context = max(context, WARMUP_STEPS) + rounds * tokens
    states = [runner.new_state() for _ in range(batch)]
    single = [runner.new_state()] if batch > 1 else None   # the batch-of-one baseline, same rounds
    fill_s = fill_context(runner, states + (single or []), context - WARMUP_STEPS)
    for step in range(WARMUP_STEPS):           # also warms the page cache and the pool
        runner.decode([(step * 31 + b) % runner.cfg.vocab_size for b in range(batch)], states)
        if single:
            runner.decode([(step * 31 + 7) % runner.cfg.vocab_size], single)
    memory = resident_memory(runner, model, len(states) + len(single or []))   # before the bandwidth buffer
    llc = cpu_lib.last_level_cache_bytes()
    bw_mib = bw_mib or probe_mib(llc)
    probe = cpu_lib.MemBandwidth(runner.pool, bw_mib << 20)
    cache_note = cache_resident_note(runner.last_bytes, llc)
    prefetch = probe.faster_stream()   # the kind of stream that reads faster here, chosen once
    results = []
    for _ in range(rounds):
        runs, bw = _round(runner, [states, single] if single else [states], tokens, probe, prefetch)
        r, one = runs[0], runs[1] if single else None
        step_s = r["seconds"] / r["steps"]
        results.append({
            "membw_gbs": bw / 1e9,
            "tok_s": batch / step_s,
            "step_ms": step_s * 1e3,
            "weights_gb_per_step": r["step_bytes"] / 1e9,
            "effective_gbs": r["step_bytes"] / step_s / 1e9,
            "bw_ratio": r["step_bytes"] / step_s / bw,
            "python_share": r["python_share"],
            "phases": r["phases"],
            **({"batch_gain": batch * one["seconds"] / r["seconds"]} if one else {}),
        })
    best = max(results, key=lambda x: x["bw_ratio"])
    huge = _huge_page_shares(runner)
    report = {
        "command": command, "model": str(model), "isa": runner.isa, "repacked": bool(runner.repacked),
        "threads": runner.threads, "batch": batch, "membw_stream": "prefetched" if prefetch else "plain",
        "huge_page_share": huge, "bw_buffer_mib": bw_mib,
        "last_level_cache_mib": llc / 2**20 if llc else None, "cache_note": cache_note,
        "context": context, "kv_type": kv_type, "context_fill_s": fill_s, "memory": memory,
        "rounds": results, "best": best,
        "median_bw_ratio": statistics.median(x["bw_ratio"] for x in results),
        "median_tok_s": statistics.median(x["tok_s"] for x in results),
    }
    if single:   # aggregate tok/s of the batch over that of one sequence, round by round
        report["median_batch_gain"] = statistics.median(x["batch_gain"] for x in results)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"$ {command}")
    if fill_s:
        typer.echo(f"context: {context} tokens (KV {kv_type}), prefilled in {fill_s:.1f} s")
    typer.echo(f"resident: {memory['rss_bytes'] / 2**30:.2f} GiB against the model file's "
               f"{memory['model_file_bytes'] / 2**30:.2f} GiB + KV {memory['kv_bytes'] / 2**30:.2f} GiB "
               f"({memory['rss_over_file_kv']:.3f}x)")
    typer.echo(f"model {model.name}  isa {runner.isa}{' (repacked)' if runner.repacked else ''}  "
               f"threads {runner.threads}  batch {batch}  "
               f"bandwidth: a {report['membw_stream']} stream of {bw_mib} MiB after each step")
    if cache_note:
        typer.echo(f"note: {cache_note}")
    typer.echo("weights mapped in 2 MB pages: " + ", ".join(
        f"{name} {'unknown' if share is None else f'{100 * share:.0f}%'}" for name, share in huge.items()))
    for i, x in enumerate(results):
        typer.echo(f"round {i}: {x['tok_s']:7.2f} tok/s  {x['weights_gb_per_step']:.3f} GB/step  "
                   f"{x['effective_gbs']:6.2f} GB/s of {x['membw_gbs']:6.2f} GB/s measured = "
                   f"{100 * x['bw_ratio']:5.1f}%  (Python {100 * x['python_share']:.1f}% of the step)"
                   + (f"  batch gain {x['batch_gain']:.2f}x" if single else ""))
    typer.echo(f"median: {report['median_tok_s']:.2f} tok/s, {100 * report['median_bw_ratio']:.1f}% of bandwidth; "
               f"best {100 * best['bw_ratio']:.1f}%"
               + (f"; batch {batch} vs 1 in the same rounds: {report['median_batch_gain']:.2f}x" if single else ""))
    if show_phases:
        for line in _phase_table(results):
            typer.echo(line)
