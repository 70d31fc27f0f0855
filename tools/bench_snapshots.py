"""Cold against warm time to first token for a repeated long prompt, through the full stack.

The router keeps snapshots (every --every tokens and at the end of each prompt); the first
request prefills everything, the repeats start from the end-of-prompt snapshot. Also prints the
bytes of one snapshot for the 35B model's shapes.

    .venv/bin/python tools/bench_snapshots.py --tokens 4000
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.model.default import default_model_path  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402

# Qwen3.6-35B-A3B: 30 Gated DeltaNet layers, 10 full-attention layers
LINEAR_LAYERS, FULL_LAYERS, V_HEADS, DK, DV, CONV_CHANNELS, CONV_TAIL = 30, 10, 32, 128, 128, 8192, 3
KV_HEADS, HEAD_DIM, VOCAB, F32 = 2, 256, 248320, 4


def snapshot_bytes_35b(tokens: int) -> dict:
    recurrent = LINEAR_LAYERS * (V_HEADS * DK * DV + CONV_CHANNELS * CONV_TAIL) * F32
    kv_per_token = FULL_LAYERS * KV_HEADS * HEAD_DIM * 2 * F32
    return {"recurrent_MiB": recurrent / 2 ** 20, "logits_MiB": VOCAB * F32 / 2 ** 20,
            "kv_KiB_per_token": kv_per_token / 2 ** 10,
            f"kv_MiB_at_{tokens}_tokens (shared between snapshots)": kv_per_token * tokens / 2 ** 20}


def ttft(client: httpx.Client, url: str, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", timeout=600, json={
            "model": "fermium", "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token came back")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model_path())
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--every", type=int, default=1024)
    ap.add_argument("--runner", "--engine", default="native")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    model = GGUFModel(args.model)
    text = (Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt").read_text()
    ids = Tokenizer.from_gguf(model).encode(text[-60000:])[:args.tokens]
    with tempfile.TemporaryDirectory() as tmp, Stack(
            str(args.model), port=free_port(), runner=args.runner, log_dir=Path(tmp),
            extra={"router": ["--snapshot-every", str(args.every)]}) as stack:
        stack.wait_ready(120)
        with httpx.Client() as client:           # one connection: a client per request costs ~50 ms itself
            ttft(client, stack.url, ids[-8:])    # warm the connection up on an unrelated prompt
            cold = ttft(client, stack.url, ids)
            warm = [ttft(client, stack.url, ids) for _ in range(args.repeats)]
    result = {"command": " ".join(sys.argv), "model": str(args.model), "prompt_tokens": len(ids),
              "cold_ttft_s": cold, "warm_ttft_s_median": statistics.median(warm),
              "warm_over_cold": statistics.median(warm) / cold,
              "snapshot_35b": snapshot_bytes_35b(len(ids))}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
