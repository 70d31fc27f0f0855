"""One long prompt through `fermium up`: time to the first token, and decode tok/s after it.

    python tools/bench_up.py --model M.gguf --prompt 8192 --tokens 64 [--backend cuda] [--requests N] [-- UP_FLAGS...]
    e.g. FERMIUM_VRAM_BUDGET=6 python tools/bench_up.py --model /tmp/syn40.gguf --prompt 8192 --backend cuda

Starts `python -m fermium up` as a user would (its context size is the prompt plus the tokens),
waits for it to be ready, sends REQUESTS streamed /v1/completions requests one after another,
each of PROMPT fresh random token ids (so no snapshot serves them; greedy, `max_tokens` TOKENS,
usage included), and times them at the client. The first pays what a cold stack pays. Prints
the figures, the command and, with --json, writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.model.gguf_file import GGUFModel  # noqa: E402
from fermium.stack import free_port, sse_events  # noqa: E402


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"fermium up exited with code {proc.returncode} before it was ready")
        try:
            if len(httpx.get(f"{url}/health", timeout=2.0).json().get("workers", ())) >= 2:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"fermium up was not ready within {timeout:.0f} s")


def one_request(url: str, ids: list[int], tokens: int, timeout: float) -> dict:
    body = {"model": "fermium", "prompt": ids, "max_tokens": tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, first, usage = time.monotonic(), None, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for chunk in sse_events(r):
            if "error" in chunk:
                raise SystemExit(f"the stream failed: {chunk['error']}")
            if chunk.get("choices") and first is None:
                first = time.monotonic()
            usage = chunk.get("usage") or usage
    end = time.monotonic()
    if first is None or usage is None:
        raise SystemExit("the stream carried no token or no usage")
    n = usage["completion_tokens"]
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": n, "ttft_s": first - t0,
            "prefill_tok_s": len(ids) / (first - t0),
            "decode_tok_s": (n - 1) / (end - first) if n > 1 and end > first else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=8192, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate")
    ap.add_argument("--backend", default="cpu", help="prefill backend: cpu or cuda")
    ap.add_argument("--requests", type=int, default=1, help="requests, one after another")
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    ap.add_argument("--request-timeout", type=float, default=3600.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("up_flags", nargs="*", help="more `fermium up` flags, after --")
    args = ap.parse_args()
    vocab = GGUFModel(args.model).config.vocab_size
    rng = np.random.default_rng(8)
    port = free_port()
    cmd = [sys.executable, "-m", "fermium", "up", "--model", args.model, "--port", str(port), "--backend",
           args.backend, "--ctx-size", str(args.prompt + args.tokens + 16), "--log-level", "info", *args.up_flags]
    print("command:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}", proc, args.ready_timeout)
        runs = [one_request(f"http://127.0.0.1:{port}", rng.integers(0, vocab, args.prompt).tolist(), args.tokens,
                            args.request_timeout) for _ in range(args.requests)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    out = {"model": args.model, "backend": args.backend, "ready_s": ready, "command": " ".join(cmd), "runs": runs}
    print(json.dumps(out, indent=1))
    for i, r in enumerate(runs):
        print(f"request {i + 1}: {args.prompt}-token prompt, {args.backend} prefill: first token after "
              f"{r['ttft_s']:.1f} s ({r['prefill_tok_s']:.1f} tok/s), then {r['decode_tok_s'] or 0:.2f} tok/s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
