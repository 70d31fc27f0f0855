"""A plain stream's pace beside costly grammars (issue 42, case 1), on a real stack.

Starts router, prefill and decode on a model (default: the demo model) with the router's
first-mask check off, so that costly json_schema requests (a `pattern` of ^(a{500}){500}$, whose
every mask costs a tenth of a second or more) reach decode, where each fails alone at its step
budget. Times a 300-token completion stream that EOS cannot end: alone, beside one and beside
three costly requests, and, as a control, beside three one-token chats without a grammar (what
three requests cost as such). Prints the median of --repeat runs of each. tests/test_grammar_budget.py
uses the same requests.

    .venv/bin/python tools/bench_grammar_budget.py --repeat 5
    .venv/bin/python tools/bench_grammar_budget.py --runner native --step-budget-ms 250
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.model.default import default_model_path  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402

PLAIN_TOKENS = 300
COSTLY = "^(a{500}){500}$"             # compiles at once; each mask then costs a tenth of a second or more
LEAD_S = 0.3                           # the side requests are at decode before the stream starts


def costly_format(pattern: str = COSTLY) -> dict:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    return {"type": "json_schema", "json_schema": {"name": "costly", "schema": schema}}


def plain_stream(url: str, eos_ids) -> tuple[float, int]:
    """Seconds and tokens of a 300-token completion stream that EOS cannot end."""
    body = {"model": "fermium", "prompt": "Once upon a time", "max_tokens": PLAIN_TOKENS, "temperature": 1,
            "seed": 7, "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": {str(t): -100 for t in eos_ids}}
    t0, tokens = time.perf_counter(), 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the plain stream got {r.status_code}")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"the plain stream failed: {chunk}")
                tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return time.perf_counter() - t0, tokens


def side_request(url: str, out: list, pattern: str | None = COSTLY) -> None:
    """A chat held to `pattern` (None: a free one-token chat, the cost of a request as such)."""
    body = {"model": "fermium", "messages": [{"role": "user", "content": "Write a's."}],
            "max_tokens": PLAIN_TOKENS if pattern else 1, "chat_template_kwargs": {"enable_thinking": False}}
    if pattern:
        body["response_format"] = costly_format(pattern)
    out.append(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300))


def beside(url: str, eos_ids, n: int, pattern: str | None = COSTLY) -> tuple[float, int, list[httpx.Response]]:
    """The plain stream's (seconds, tokens) with `n` side requests sent just before, and their replies."""
    replies: list = []
    threads = [threading.Thread(target=side_request, args=(url, replies, pattern)) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(LEAD_S)
    seconds, tokens = plain_stream(url, eos_ids)
    for t in threads:
        t.join(300)
    return seconds, tokens, replies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--runner", default="reference")
    ap.add_argument("--step-budget-ms", type=float, default=100.0, help="decode's --grammar-step-budget-ms")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    eos_ids = sorted(Tokenizer.from_gguf(GGUFModel(args.model)).eos_ids)
    extra = {"router": ["--grammar-first-mask-ms", "0"],
             "decode": ["--grammar-step-budget-ms", str(args.step_budget_ms)]}
    with tempfile.TemporaryDirectory() as logs, Stack(args.model, port=free_port(), runner=args.runner, extra=extra,
                                                      log_dir=Path(logs)) as s:
        s.wait_ready(120)
        plain_stream(s.url, eos_ids)                    # warm
        runs: dict[str, list[float]] = {"alone": [], "one": [], "three": [], "control": []}
        for _ in range(args.repeat):                    # interleaved, so that a host's drift touches all alike
            runs["alone"].append(plain_stream(s.url, eos_ids)[0])
            runs["one"].append(beside(s.url, eos_ids, 1)[0])
            runs["three"].append(beside(s.url, eos_ids, 3)[0])
            runs["control"].append(beside(s.url, eos_ids, 3, None)[0])
    med = {k: statistics.median(v) for k, v in runs.items()}
    alone = med["alone"]
    print(f"plain {PLAIN_TOKENS}-token stream, median of {args.repeat} ({args.runner} runner, step budget "
          f"{args.step_budget_ms:.0f} ms): alone {alone:.2f} s; beside one costly grammar {med['one']:.2f} s "
          f"({med['one'] / alone:.2f}x); beside three {med['three']:.2f} s ({med['three'] / alone:.2f}x); "
          f"beside three one-token chats without a grammar {med['control']:.2f} s ({med['control'] / alone:.2f}x)")


if __name__ == "__main__":
    main()
