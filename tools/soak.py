"""Soak: does any process of the stack keep growing under a long, mixed load?

Starts router, prefill and decode (fermium.stack.Stack) on a model, sends --requests requests
from --concurrency clients: completions and chat, streamed and not, some streams cancelled by
closing the connection after a few events, some bad requests (each should get a 4xx), and the
hostile clients of issue 42 (tools/soak_hostile.py: non-reading streams, stalled bodies, slowloris
headers, a costly json_schema, forged control tokens, `n` > 1; --mix sets any kind's weight), under
short send, header and body timeouts so that they cycle fast. Outcomes are counted by kind; a 5xx
(but decode's grammar budget error, counted apart), an error event, a transport error or a hang is
a failure. Each process's resident memory (VmRSS, with its children's) is read after --warmup requests and at
the end; the growth in between is printed per process. The goal: under 10% after warm-up.

The router's snapshot cache and prefill's held states grow by design up to their budgets, so the
soak bounds them (--snapshot-budget-gib, --held-budget-gib): small enough that the warm-up fills them.

    .venv/bin/python tools/soak.py                       # the bundled demo model
    .venv/bin/python tools/soak.py --model M.gguf --runner native --requests 5000
    .venv/bin/python tools/soak.py --mix near-limit=0,non-reader=0
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import re
import shlex
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.model.default import default_model_path  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402
from tools.soak_hostile import BODY_S, HEADER_S, HOSTILE, ROUTER_FLAGS, SEND_S, Target, failed  # noqa: E402

READY_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 120
GOAL_GROWTH = 0.10
KINDS = {"completion": 30, "completion-stream": 20, "chat": 15, "chat-stream": 15, "cancelled": 10, "bad": 10,
         **{kind: weight for kind, (_, weight) in HOSTILE.items()}}
# (route, raw body) pairs that a server must refuse with a 4xx
BAD = [
    ("/v1/completions", b'{"model": "fermium", "prompt": "x", "temperature": -1}'),
    ("/v1/completions", b'{"model": "fermium", "prompt": "x", "max_tokens": -3}'),
    ("/v1/completions", b'{"model": "fermium"}'),
    ("/v1/completions", b'{not json'),
    ("/v1/chat/completions", b'{"model": "fermium", "messages": "not a list"}'),
    ("/v1/completions", b'{"model": "fermium", "prompt": "x", "top_k": 18446744073709551616}'),
    ("/v1/completions", b'{"model": "fermium", "prompt": "x", "repetition_penalty": 1e-308}'),
    ("/v1/completions", b'{"model": "fermium", "prompt": "\\ud800"}'),
    ("/v1/completions", b"[" * 1000 + b"]" * 1000),
    ("/v1/nowhere", b"{}"),
]


def rss_kb(pid: int) -> int:
    """VmRSS of a process and of its descendants, in kB (0 for one that is gone)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class Load:
    """One request of a seeded mix at a time per thread; outcomes counted by kind and status."""

    def __init__(self, url: str, words: list[str], seed: int, max_tokens: int, target: Target, mix: dict):
        self.url, self.words, self.seed, self.max_tokens = url, words, seed, max_tokens
        self.target, self.mix = target, {k: w for k, w in mix.items() if w > 0}
        self.outcomes: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.local = threading.local()

    def client(self) -> httpx.Client:
        if not hasattr(self.local, "client"):
            self.local.client = httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S)
        return self.local.client

    def body(self, rng: random.Random, chat: bool, stream: bool) -> dict:
        start = rng.randrange(len(self.words))
        text = " ".join(self.words[start:start + rng.choice([3, 10, 30, 120, 400])])
        body = {"model": "fermium", "max_tokens": rng.randint(1, self.max_tokens), "stream": stream,
                "temperature": rng.choice([0.0, 0.0, 0.7, 1.0]), "seed": rng.randrange(1 << 30)}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return body

    def one(self, i: int) -> None:
        rng = random.Random(self.seed * 1_000_003 + i)
        kind = rng.choices(list(self.mix), weights=list(self.mix.values()))[0]
        try:
            status = self._send(rng, kind)
        except httpx.HTTPError as e:
            status = f"transport error ({type(e).__name__})"
        with self.lock:
            self.outcomes[kind, status] += 1

    def _send(self, rng: random.Random, kind: str):
        c = self.client()
        if kind in HOSTILE:
            return HOSTILE[kind][0](self.target, rng, c)
        if kind == "bad":
            route, raw = rng.choice(BAD)
            return c.post(route, content=raw, headers={"content-type": "application/json"}).status_code
        chat, stream = kind.startswith("chat"), kind != "completion" and kind != "chat"
        route = "/v1/chat/completions" if chat else "/v1/completions"
        if not stream:
            return c.post(route, json=self.body(rng, chat, False)).status_code
        body = self.body(rng, rng.random() < 0.5 if kind == "cancelled" else chat, True)
        if kind == "cancelled":
            route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            body["max_tokens"] = self.max_tokens
        keep = rng.randint(1, 3)
        with c.stream("POST", route, json=body) as r:
            events, errors, done = 0, 0, False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events += 1
                done |= line == "data: [DONE]"
                errors += not done and "error" in json.loads(line[6:])
                if kind == "cancelled" and events >= keep:
                    return "cancelled"                  # leaving the block closes the connection
            if r.status_code != 200 or (done and not errors):
                return r.status_code
            return f"{r.status_code} ({'error event' if errors else 'no [DONE]'})"

    def run(self, start: int, stop: int, concurrency: int) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(self.one, range(start, stop)))


def sample(stack: Stack) -> dict[str, int]:
    return {name: rss_kb(p.pid) for name, p in stack.procs.items()}


def report(args, at_warmup: dict, at_end: dict, series: list, load: Load, elapsed: float) -> bool:
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"{args.requests} requests ({args.warmup} of warm-up) in {elapsed:.0f} s, "
          f"{args.concurrency} clients, runner {args.runner}, model {Path(args.model).name}")
    print(f"router --send-timeout {SEND_S:g} --header-timeout {HEADER_S:g} --body-timeout {BODY_S:g}; mix "
          + ", ".join(f"{k}={w:g}" for k, w in args.mix.items()))
    print("outcomes (kind, status: count):")
    for (kind, status), n in sorted(load.outcomes.items(), key=str):
        print(f"  {kind:18} {status!s:30} {n}")
    print(f"{'process':10} {'warm-up MB':>11} {'end MB':>9} {'growth MB':>10} {'growth':>8}")
    ok = True
    for name in at_end:
        a, b = at_warmup[name] / 1024, at_end[name] / 1024
        growth = (b - a) / a if a else float("inf")
        ok &= growth < GOAL_GROWTH
        print(f"{name:10} {a:11.1f} {b:9.1f} {b - a:10.1f} {growth:8.1%}")
    print("RSS MB after each batch of requests:")
    for done, rss in series:
        print(f"  {done:6}  " + "  ".join(f"{n} {kb / 1024:.1f}" for n, kb in rss.items()))
    fivexx = sum(n for (_, s), n in load.outcomes.items() if str(s).startswith("5") and failed(s))
    failures = sum(n for (_, s), n in load.outcomes.items() if failed(s))
    budget = sum(n for (_, s), n in load.outcomes.items() if not failed(s) and str(s).startswith("5"))
    print(f"5xx: {fivexx} (and {budget} grammar budget errors, expected); failures (5xx, error events, "
          f"transport errors, hangs): {failures}; growth under {GOAL_GROWTH:.0%} for every process: {ok}")
    if args.json:
        Path(args.json).write_text(json.dumps({"warmup_kb": at_warmup, "end_kb": at_end, "series": series,
                                               "outcomes": {f"{k}|{s}": n for (k, s), n in load.outcomes.items()},
                                               "elapsed_s": elapsed, "argv": sys.argv}, indent=1))
    return ok and not failures


def weights(text: str) -> dict:
    """--mix's kind=weight,... over the default weights."""
    mix = dict(KINDS)
    for item in filter(None, text.split(",")):
        kind, _, weight = item.partition("=")
        if kind not in KINDS:
            raise SystemExit(f"--mix: no kind {kind!r}; the kinds: {', '.join(KINDS)}")
        mix[kind] = float(weight)
    return mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(default_model_path()), help="GGUF file (default: the bundled demo model)")
    ap.add_argument("--runner", "--engine", default="auto", help="decode runner: auto, native, reference")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200, help="requests before the first RSS sample")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--snapshot-budget-gib", type=float, default=0.02)
    ap.add_argument("--held-budget-gib", type=float, default=0.02, help="prefill's --held-budget")
    ap.add_argument("--every", type=int, default=200, help="requests between RSS samples of the series")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", type=weights, default=dict(KINDS), help="kind=weight,... over the default weights "
                    f"({', '.join(f'{k}={w}' for k, w in KINDS.items())})")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    text = (Path(__file__).resolve().parents[1] / "models" / "heldout_sample.txt").read_text()
    with tempfile.TemporaryDirectory() as logs:
        stack = Stack(args.model, port=free_port(), runner=args.runner, log_dir=Path(logs),
                      extra={"router": ["--snapshot-budget", str(args.snapshot_budget_gib), *ROUTER_FLAGS],
                             "prefill": ["--held-budget", str(args.held_budget_gib)]})
        with stack:
            stack.wait_ready(READY_TIMEOUT_S)
            found = re.search(r"decode runner: (\w+)", (Path(logs) / "decode.log").read_text())
            args.runner += f" ({found.group(1)})" if found else ""
            eos = tuple(sorted(Tokenizer.from_gguf(GGUFModel(args.model)).eos_ids))
            load = Load(stack.url, text.split() * 4, args.seed, args.max_tokens, Target(stack.url, stack.port, eos),
                        args.mix)
            t0 = time.monotonic()
            load.run(0, args.warmup, args.concurrency)
            at_warmup, series = sample(stack), []
            series.append((args.warmup, at_warmup))
            for start in range(args.warmup, args.requests, args.every):
                load.run(start, min(start + args.every, args.requests), args.concurrency)
                series.append((min(start + args.every, args.requests), sample(stack)))
            elapsed = time.monotonic() - t0
            at_end = series[-1][1]
            dead = [n for n, p in stack.procs.items() if p.poll() is not None]
            if dead:
                print(f"died during the soak: {', '.join(dead)}; logs: {logs}")
                for name in dead:
                    print((Path(logs) / f"{name}.log").read_text()[-3000:])
        ok = report(args, at_warmup, at_end, series, load, elapsed)
    sys.exit(0 if ok and not dead else 1)


if __name__ == "__main__":
    main()
