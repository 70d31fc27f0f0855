"""Overhead of the service stack, and the cost of shipping a 35B-sized state.

1. The same prompt and model, greedy, in this process and through the full stack (router,
   prefill, decode as processes, one streaming HTTP request): time to first token and decode
   tok/s, and their ratios.
2. A SequenceState of the 35B model's shapes (30 linear layers of 32x128x128 f32 plus an
   8192x3 conv tail, 10 full layers of KV for --kv-tokens) sent through our protocol over
   loopback TCP, PushQueue -> PullQueue: median one-way time and throughput.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python tools/bench_stack.py --model M.gguf --runner reference

(One BLAS thread per process: on a shared 2-core machine, BLAS threads that spin for a core
slow numpy prefill several-fold, on both sides, and drown the comparison in noise.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.engines import load_runner  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from common.mp import PullQueue, PushQueue  # noqa: E402
from common.protocol.decode import DecodeRequest  # noqa: E402
from common.reference.model import ReferenceModel  # noqa: E402
from common.sampling import Sampler, SamplingParams  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402

# the 35B model's per-sequence state
LINEAR_LAYERS, FULL_LAYERS = 30, 10
SSM_SHAPE, CONV_SHAPE, KV_HEADS, HEAD_DIM = (32, 128, 128), (8192, 3), 2, 256


def _summary(runs: list[tuple[float, float, int]]) -> dict:
    """Medians over runs of (first token time, last token time, tokens), in seconds from the
    request: time to first token, decode rate between first and last, time to the last token."""
    return {"ttft_s": statistics.median(first for first, _, _ in runs),
            "tok_per_s": statistics.median((n - 1) / (last - first) for first, last, n in runs),
            "e2e_s": statistics.median(last for _, last, _ in runs),
            "tokens": statistics.median(n for _, _, n in runs)}


def local_worker(model_path: str, runner_name: str, prompt: str) -> None:
    """The in-process side, run as a child: one generation per line on stdin, times as JSON."""
    model = GGUFModel(model_path)
    ids = Tokenizer.from_gguf(model).encode(prompt)
    prefill_model = ReferenceModel(model)                # what the `cpu` prefill backend runs
    _, decoder = load_runner(runner_name, model)
    for line in sys.stdin:
        t0 = time.perf_counter()
        sampler, state = Sampler(SamplingParams()), prefill_model.new_state()
        token = sampler.sample(prefill_model.prefill(ids, state), ids)
        times = [time.perf_counter() - t0]
        for _ in range(int(line) - 1):
            token = sampler.sample(decoder.decode([token], [state])[0], ids)
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


def compare(model_path: str, runner_name: str, prompt: str, max_tokens: int, runs: int) -> tuple[dict, dict]:
    """Alternate in-process and full-stack generations, so both see the same machine load.

    The in-process side runs in a child process in a session of its own, as each service does:
    with the kernel's per-session CPU groups (autogroup), anything else would compare unequal
    shares of a busy machine."""
    local = subprocess.Popen([sys.executable, __file__, "--local-worker", "--model", model_path, "--runner",
                              runner_name, "--prompt", prompt], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)

    def run_local(n: int) -> tuple[float, float, int]:
        local.stdin.write(f"{n}\n")
        local.stdin.flush()
        times = json.loads(local.stdout.readline())
        return times[0], times[-1], len(times)

    body = {"model": "fermium", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sides: dict[str, list[tuple[float, float, int]]] = {"local": [], "stack": []}
    try:
        with tempfile.TemporaryDirectory() as logs, httpx.Client(timeout=None) as client, \
                Stack(model_path, port=free_port(), runner=runner_name, log_dir=Path(logs)) as stack:
            stack.wait_ready(120)
            run_local(2)                                   # warm-ups: first-call costs are not the subject
            _stream(client, stack.url, {**body, "max_tokens": 2})
            for _ in range(runs):
                sides["local"].append(run_local(max_tokens))
                t0 = time.perf_counter()
                first, last, n = _stream(client, stack.url, body)
                sides["stack"].append((first - t0, last - t0, n))
    finally:
        local.stdin.close()
        local.wait(timeout=30)
    return _summary(sides["local"]), _summary(sides["stack"])


def _stream(client: httpx.Client, url: str, body: dict) -> tuple[float, float, int]:
    """(arrival of the first text, arrival of the last text, completion tokens) of one stream.
    A chunk may carry several tokens (the router joins those already queued)."""
    times, tokens = [], 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["text"]:
                times.append(time.perf_counter())
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return times[0], times[-1], tokens


def state_arrays(kv_tokens: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    conv = [rng.standard_normal(CONV_SHAPE, dtype=np.float32) for _ in range(LINEAR_LAYERS)]
    ssm = [rng.standard_normal(SSM_SHAPE, dtype=np.float32) for _ in range(LINEAR_LAYERS)]
    kv = [rng.standard_normal((kv_tokens, KV_HEADS, HEAD_DIM), dtype=np.float32) for _ in range(2 * FULL_LAYERS)]
    return conv + ssm + kv


def ship_state(kv_tokens: int, repeats: int) -> dict:
    arrays = state_arrays(kv_tokens)
    logits = np.zeros(248320, np.float32)
    inbox = PullQueue("tcp://127.0.0.1:0", name="bench")
    out = PushQueue(inbox.address, name="bench")
    times = []
    try:
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            out.put(DecodeRequest(f"r{i}", kv_tokens, [], {}, 1, [], False, arrays, logits, "f32"))
            got = inbox.get(timeout=30)
            times.append(time.perf_counter() - t0)
            assert got is not None and np.array_equal(got.state[0], arrays[0])
    finally:
        out.close()
        inbox.close()
    nbytes = sum(a.nbytes for a in arrays) + logits.nbytes
    median = statistics.median(times[1:])                  # the first send also opens the connection
    return {"state_mib": nbytes / 2**20, "median_s": median, "gb_per_s": nbytes / median / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the bundled demo model)")
    ap.add_argument("--ship-only", action="store_true", help="only the state-shipping measurement")
    ap.add_argument("--runner", "--engine", default="reference", help="decode runner: reference, native")
    ap.add_argument("--prompt", default="ROMEO:\nWhat light through yonder window breaks? It is the east,")
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="long enough that a burst at the stream's start does not flatter the rate")
    ap.add_argument("--kv-tokens", type=int, default=0, help="tokens of KV in the shipped state")
    ap.add_argument("--runs", type=int, default=5, help="generations per side (medians are reported)")
    ap.add_argument("--repeats", type=int, default=10, help="state sends")
    ap.add_argument("--local-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.local_worker:
        local_worker(args.model, args.runner, args.prompt)
        return
    ship = ship_state(args.kv_tokens, args.repeats)
    print(f"state ship   {ship['state_mib']:.1f} MiB ({args.kv_tokens} tokens of KV, logits included) over "
          f"loopback TCP: {ship['median_s'] * 1e3:.1f} ms median of {args.repeats} ({ship['gb_per_s']:.2f} GB/s)")
    if args.ship_only:
        return
    if args.model is None:
        from common.model.default import default_model_path
        args.model = str(default_model_path())
    local, stack = compare(args.model, args.runner, args.prompt, args.max_tokens, args.runs)
    print(f"model {args.model}, decode runner {args.runner}, {args.max_tokens} tokens, median of {args.runs} runs")
    for name, side in (("in-process", local), ("full stack", stack)):
        print(f"{name:12} TTFT {side['ttft_s'] * 1e3:8.1f} ms   decode {side['tok_per_s']:8.1f} tok/s"
              f"   last token {side['e2e_s'] * 1e3:8.1f} ms   ({side['tokens']:.0f} tokens)")
    print(f"stack/local  TTFT x{stack['ttft_s'] / local['ttft_s']:.3f}   "
          f"decode tok/s x{stack['tok_per_s'] / local['tok_per_s']:.3f}   "
          f"last token x{stack['e2e_s'] / local['e2e_s']:.3f}")

if __name__ == "__main__":
    main()
