"""The native speculative cycle's parts at real width: a decode step (one row per sequence) against
a verify of 2..k+1 rows per sequence, and the MTP draft step, on the CPU runner.

    python tools/bench_verify.py /tmp/syn-mtp-q4_k_m.gguf [--threads 2] [--batches 1 4]
                                 [--rows 2 3 4] [--context 16] [--rounds 7] [--steps 4]
                                 [--draft-vocab 32768] [--kv-type f16] [--json OUT]

Each round times `steps` calls of every case in turn (decode, verify with each row count, the draft
step over the whole vocabulary and over the draft vocabulary, set untimed before its calls), so
that whatever else the machine does falls on all cases alike; the figures are the medians over
rounds of the seconds per call. A verify is followed by keep() of one row, as a rejection of
every draft would, inside the timing. Also prints
the rollback bytes per sequence for k = 1..3 drafts (k slots), for this file and for the same
widths with the trunk's linear layers of `--real-layers`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from common.model.gguf_file import GGUFModel
from native.cpu_runner import CpuRunner

FREQUENT_IDS_SEED = 0   # the draft vocabulary's ids: any fixed set of that size costs the same


def timed(fn, steps: int, setup=None) -> float:
    if setup:
        setup()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--real-layers", type=int, default=40, help="trunk layers of the real model (every 4th full)")
    ap.add_argument("--json")
    args = ap.parse_args()

    runner = CpuRunner(GGUFModel(args.model), threads=args.threads, kv_type=args.kv_type)
    cfg, rng = runner.cfg, np.random.default_rng(1)
    cases: dict[str, Callable[[], None]] = {}
    setups: dict[str, Callable[[], None]] = {}
    for batch in args.batches:
        states = [runner.new_state() for _ in range(batch)]
        for s in states:
            runner.prefill(rng.integers(0, cfg.vocab_size, args.context).tolist(), s)
        rollbacks = [runner.new_rollback(max(args.rows) - 1) for _ in range(batch)]

        def decode(states=states, batch=batch):
            runner.decode(rng.integers(0, cfg.vocab_size, batch).tolist(), states)
        cases[f"batch {batch} decode"] = decode
        for rows in args.rows:
            def verify(states=states, rollbacks=rollbacks, rows=rows, batch=batch):
                tokens = rng.integers(0, cfg.vocab_size, (batch, rows)).tolist()
                runner.verify(tokens, states, rollbacks)
                for s, rb in zip(states, rollbacks):
                    runner.keep(s, rb, 1, rows)
            cases[f"batch {batch} verify {rows} rows"] = verify
    if runner.has_mtp:
        pick = np.random.default_rng(FREQUENT_IDS_SEED)
        vocab = np.sort(pick.choice(cfg.vocab_size, args.draft_vocab, replace=False))
        for batch in args.batches:
            dstates = [runner.new_draft_state() for _ in range(batch)]
            hidden = rng.standard_normal((batch, cfg.hidden_size)).astype(np.float32)
            for name, ids in (("full vocab", None), (f"{args.draft_vocab} ids", vocab)):
                def draft(dstates=dstates, hidden=hidden, batch=batch):
                    runner.draft([[int(t)] for t in rng.integers(0, cfg.vocab_size, batch)], hidden, dstates)
                    for d in dstates:
                        d.pos = min(d.pos, args.context)   # the draft KV stays short, as it does in decode
                cases[f"batch {batch} draft 1 row, {name}"] = draft
                setups[f"batch {batch} draft 1 row, {name}"] = lambda ids=ids: runner.set_draft_vocab(ids)
    for name, fn in cases.items():   # warm-up: buffers grown, pages touched
        timed(fn, 1, setups.get(name))
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            seconds[name].append(timed(fn, args.steps, setups.get(name)))
    med = {name: statistics.median(v) for name, v in seconds.items()}
    print(f"{args.model}: threads {args.threads}, KV {args.kv_type}, context {args.context}, "
          f"isa {runner.isa}, {args.rounds} rounds of {args.steps} calls; median ms per call")
    for name, s in med.items():
        batch = name.split()[1]
        rel = s / med[f"batch {batch} decode"]
        print(f"  {name:34s} {1e3 * s:8.2f} ms   {rel:5.2f}x decode")
    n_lin = len(cfg.linear_layers)
    real_lin = args.real_layers - args.real_layers // 4
    rollback = {k: runner.rollback_bytes(k) for k in (1, 2, 3)}
    L = args.real_layers
    print(f"rollback bytes per sequence ({n_lin} linear layers here, {real_lin} in the {L}-layer model):")
    for k, b in rollback.items():
        print(f"  k = {k}: {b / 2**20:8.2f} MiB here, {b * real_lin / n_lin / 2**20:8.2f} MiB at {L} layers")
    if runner.has_mtp:
        print(f"draft KV bytes per position ({args.kv_type}): {runner.draft_state_bytes(1)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_s": med, "seconds": seconds, "rollback_bytes": rollback,
                       "real_rollback_bytes": {k: b * real_lin // n_lin for k, b in rollback.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
