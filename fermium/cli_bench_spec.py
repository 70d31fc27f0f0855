"""`fermium bench decode --speculative mtp`: the speculative cycle's speed against plain decode.

Random weights accept no draft, so acceptance is forced (common.speculative_accept.
ForcedAcceptance): each draft is taken with probability --accept-rate, up to the first refusal,
from a fixed seed. Everything else is the serving cycle (common.speculative): the MTP block's
draft rows, the verify of 1 + k rows per sequence in one batched step, the rollback of the
refused rows, on the real file. Rounds alternate between the speculative batch and a plain
batch of the same size on the same runner, so that both meet the same machine; each reports
tokens per second, and the ratio is taken round by round.
"""
from __future__ import annotations

import json
import statistics
import time

import typer

from common.generation import GenerationPolicy
from common.sampling import Sampler, SamplingParams
from common.speculative import Lane, Speculator, check_mtp
from common.speculative_accept import ForcedAcceptance

ACCEPT_SEED = 0
NEVER = 1 << 62     # max_tokens of a benchmark sequence: it never ends


def _token(step: int, b: int, vocab: int) -> int:
    return (step * 7919 + b * 104729) % vocab


def _plain_round(runner, states: list, tokens: int, step0: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    for step in range(tokens):
        runner.decode([_token(step0 + step, b, runner.cfg.vocab_size) for b in range(len(states))], states)
    return time.perf_counter() - t0, tokens * len(states)


def _spec_round(spec: Speculator, lanes: list[Lane], cycles: int) -> tuple[float, int]:
    taken = [0]

    def emit(lane, token, row):
        lane.next_token = token
        lane.history.append(token)
        taken[0] += 1
        return True

    t0 = time.perf_counter()
    for _ in range(cycles):
        spec.step(lanes, emit)
    return time.perf_counter() - t0, taken[0]


def speculative_bench(runner, model, *, batch: int, k: int, accept_rate: float, tokens: int, rounds: int,
                      context: int, warmup: int, fill, draft_ids=None) -> dict:
    """Rounds of `tokens` plain decode steps and of `tokens` speculative cycles of `batch`
    sequences each, in turn, after `context` tokens of context (`fill`: bench_runner.fill_context)."""
    check_mtp(model, runner)
    runner.max_context = max(context, warmup) + (rounds + warmup + 1) * tokens * (k + 1) + k + 1
    plain = [runner.new_state() for _ in range(batch)]
    lanes = [Lane(runner.new_state(), Sampler(SamplingParams()), [], GenerationPolicy(NEVER)) for _ in range(batch)]
    fill_s = fill(runner, plain + [lane.state for lane in lanes], context - warmup)
    judge = ForcedAcceptance(accept_rate, seed=ACCEPT_SEED)
    spec = Speculator(runner, k, judge=judge, draft_ids=draft_ids, max_positions=runner.max_context, auto_off=False)
    for b, lane in enumerate(lanes):
        lane.next_token, lane.draft = _token(0, b, runner.cfg.vocab_size), spec.start()
    _plain_round(runner, plain, warmup, 0)
    _spec_round(spec, lanes, warmup)               # the first cycle has no drafts; the next ones do
    spec.drafted = spec.accepted = 0
    results = []
    for r in range(rounds):
        order = ("spec", "plain") if r % 2 == 0 else ("plain", "spec")
        got = {}
        cycles_before = (spec.drafted, spec.accepted)
        for kind in order:
            if kind == "spec":
                got[kind] = _spec_round(spec, lanes, tokens)
            else:
                got[kind] = _plain_round(runner, plain, tokens, warmup + r * tokens)
        (s_sec, s_tok), (p_sec, p_tok) = got["spec"], got["plain"]
        drafted, accepted = spec.drafted - cycles_before[0], spec.accepted - cycles_before[1]
        results.append({"spec_tok_s": s_tok / s_sec, "plain_tok_s": p_tok / p_sec,
                        "ratio": (s_tok / s_sec) / (p_tok / p_sec), "tokens_per_cycle": s_tok / (tokens * batch),
                        "acceptance": accepted / drafted if drafted else None})
    return {"batch": batch, "draft_tokens": k, "accept_rate": accept_rate, "context": context,
            "context_fill_s": fill_s, "draft_vocab": None if draft_ids is None else int(len(draft_ids)),
            "rollback_bytes_per_sequence": runner.rollback_bytes(k),
            "draft_kv_bytes_per_sequence": runner.draft_state_bytes(runner.max_context),
            "rounds": results,
            "median_spec_tok_s": statistics.median(x["spec_tok_s"] for x in results),
            "median_plain_tok_s": statistics.median(x["plain_tok_s"] for x in results),
            "median_ratio": statistics.median(x["ratio"] for x in results)}


def report_lines(r: dict) -> list[str]:
    lines = [f"speculative mtp: {r['draft_tokens']} draft tokens, forced acceptance {r['accept_rate']:g} per draft, "
             f"batch {r['batch']}, context {r['context']}"
             + (f", draft vocabulary {r['draft_vocab']}" if r["draft_vocab"] else "")]
    for i, x in enumerate(r["rounds"]):
        acc = "-" if x["acceptance"] is None else f"{x['acceptance']:.2f}"
        lines.append(f"round {i}: speculative {x['spec_tok_s']:7.2f} tok/s ({x['tokens_per_cycle']:.2f} tokens a "
                     f"cycle, acceptance {acc})  plain {x['plain_tok_s']:7.2f} tok/s  ratio {x['ratio']:.3f}x")
    lines.append(f"median: speculative {r['median_spec_tok_s']:.2f} tok/s, plain {r['median_plain_tok_s']:.2f} tok/s, "
                 f"ratio {r['median_ratio']:.3f}x")
    lines.append(f"rollback slots: {r['rollback_bytes_per_sequence'] / 2**20:.2f} MiB per sequence; draft KV "
                 f"{r['draft_kv_bytes_per_sequence'] / 2**20:.2f} MiB per sequence at this run's context")
    return lines


def speculative_command(command, model, threads, isa, prefault, repack, kv_type, batch, tokens, rounds, context,
                        mode, k, accept_rate, draft_vocab, as_json) -> None:
    """`fermium bench decode --speculative mtp`: the runner loaded, the rounds run, the report printed."""
    from common.model.gguf_file import GGUFModel
    from common.speculative import check_settings, draft_vocab_ids
    from fermium.bench_runner import WARMUP_STEPS, fill_context, native_runner
    check_settings(mode, k, draft_vocab)
    check_mtp(GGUFModel(model))                 # before the weights are mapped
    runner = native_runner(model, threads, isa, prefault=prefault, repack=repack, kv_type=kv_type)
    result = speculative_bench(runner, runner.model, batch=batch, k=k, accept_rate=accept_rate, tokens=tokens,
                               rounds=rounds, context=context, warmup=WARMUP_STEPS, fill=fill_context,
                               draft_ids=draft_vocab_ids(runner.model, draft_vocab))
    report = {"command": command, "model": str(model), "isa": runner.isa, "repacked": bool(runner.repacked),
              "threads": runner.threads, "kv_type": kv_type, **result}
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"$ {command}")
    typer.echo(f"model {model.name}  isa {runner.isa}{' (repacked)' if runner.repacked else ''}  "
               f"threads {runner.threads}  KV {kv_type}")
    for line in report_lines(report):
        typer.echo(line)
