"""Held-out perplexity: transformers on the original weights against Fermium's reference model
on GGUF files of the same model.

Both see the same token ids (the checkpoint's tokenizer.json; the GGUF's embedded tokenizer is
checked to agree), cut into non-overlapping windows, each scored from an empty state.

    .venv/bin/python tools/eval_ppl.py build/demo-hf models/shakespeare-demo-f32.gguf \
        models/shakespeare-demo-q8_0.gguf
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.train_demo import DEFAULT_DATA, split_text  # noqa: E402


def held_out_ids(encode, data: Path, n_tokens: int) -> list[int]:
    _, held_out = split_text(data.read_text(encoding="utf-8"))
    ids = encode(held_out)
    if len(ids) < n_tokens + 1:
        raise SystemExit(f"the held-out text has only {len(ids)} tokens; ask for fewer than {n_tokens}")
    return ids[:n_tokens + 1]


def windows(ids: list[int], window: int) -> list[list[int]]:
    # each window carries one extra token: the target of its last position
    return [ids[i:i + window + 1] for i in range(0, len(ids) - 1, window)]


def nll_sum(logits: np.ndarray, targets: list[int]) -> float:
    # logits: [T, vocab]; float64 so the sum over thousands of tokens stays exact enough
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].sum())


def reference_logits(gguf: Path):
    from common.model.gguf_file import GGUFModel
    from common.reference.model import ReferenceModel
    reference = ReferenceModel(GGUFModel(gguf))
    return lambda ids: reference.prefill(ids, reference.new_state(), all_logits=True)


def transformers_logits(hf_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

    def run(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    return run


def perplexity(logits_of, chunks: list[list[int]]) -> tuple[float, int]:
    total, count = 0.0, 0
    for chunk in chunks:
        total += nll_sum(logits_of(chunk[:-1]), chunk[1:])
        count += len(chunk) - 1
    return math.exp(total / count), count


def tokenizer_agrees(gguf: Path, hf_tok, text: str) -> bool:
    from common.model.gguf_file import GGUFModel
    from common.model.tokenizer import Tokenizer
    return Tokenizer.from_gguf(GGUFModel(gguf)).encode(text) == hf_tok.encode(text).ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", type=Path, help="the original checkpoint (config.json, safetensors, tokenizer.json)")
    ap.add_argument("gguf", type=Path, nargs="+", help="GGUF files converted from it")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the training text; its last 10%% is scored")
    ap.add_argument("--tokens", type=int, default=4096, help="held-out tokens to score, from the start")
    ap.add_argument("--window", type=int, default=512, help="tokens per window, each from an empty state")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer as HFTokenizer
    torch.set_num_threads(1)
    hf_tok = HFTokenizer.from_file(str(args.hf_dir / "tokenizer.json"))
    ids = held_out_ids(lambda text: hf_tok.encode(text).ids, args.data, args.tokens)
    chunks = windows(ids, args.window)
    _, held_out = split_text(args.data.read_text(encoding="utf-8"))

    t0 = time.time()
    base, n = perplexity(transformers_logits(args.hf_dir), chunks)
    rows = [{"model": "transformers (original weights)", "ppl": base, "rel": 0.0, "seconds": time.time() - t0}]
    for path in args.gguf:
        t0 = time.time()
        ppl, _ = perplexity(reference_logits(path), chunks)
        rows.append({"model": f"reference model, {path.name}", "ppl": ppl, "rel": ppl / base - 1,
                     "seconds": time.time() - t0,
                     "size_mib": path.stat().st_size / 2**20,
                     "tokenizer_agrees": tokenizer_agrees(path, hf_tok, held_out[:20000])})
    print(f"held-out perplexity over {n} tokens in windows of {args.window}")
    print(f"{'model':<52} {'ppl':>9} {'vs HF':>9}")
    for r in rows:
        print(f"{r['model']:<52} {r['ppl']:9.4f} {100 * r['rel']:+8.4f}%")
    if args.json:
        args.json.write_text(json.dumps({"tokens": n, "window": args.window, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
