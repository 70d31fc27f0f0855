"""The MTP head's top-1 on held-out text, with Fermium's reference model on GGUF files.

For each position i of a window (teacher-forced on the held-out text), the draft step gets the
next token x_{i+1} and the trunk's hidden h_i and guesses x_{i+2}. Two figures:
- text top-1: the guess is the held-out text's x_{i+2};
- greedy agreement: the guess is the trunk's own greedy choice after x_{i+1}, which is what a
  greedy verify accepts (k = 1) when x_{i+1} was the trunk's choice too.

With --speculate K..., the real speculative loop instead (native runner, greedy, auto-off off):
each prompt is a stretch of the held-out text, each continuation --gen tokens; printed per k are
the drafts accepted over those made and the tokens a cycle takes.

    .venv/bin/python tools/eval_mtp.py models/shakespeare-demo-f32.gguf models/shakespeare-demo-q8_0.gguf
    .venv/bin/python tools/eval_mtp.py models/shakespeare-demo-q8_0.gguf --speculate 1 2 3
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.eval_ppl import held_out_ids, windows  # noqa: E402
from tools.train_demo import DEFAULT_DATA  # noqa: E402


def mtp_hits(reference, window: list[int]) -> tuple[int, int, int]:
    """(text hits, greedy-agreement hits, positions) over one window, from an empty state."""
    ids = window[:-1]
    rows = len(ids)
    logits, hidden = reference.verify([ids], [reference.new_state()], [reference.new_rollback(rows)])
    # draft row i: token ids[i + 1] with h_i guesses the token at i + 2
    draft_logits, _ = reference.draft([ids[1:]], hidden[:-1], [reference.new_draft_state()])
    guess = draft_logits.argmax(-1)                       # [rows - 1]
    text = np.asarray(window[2:])
    greedy = logits[1:].argmax(-1)
    return int((guess == text).sum()), int((guess == greedy).sum()), rows - 1


def speculate(model, ids: list[int], ks: list[int], prompts: int, prompt_len: int, gen: int) -> None:
    """Acceptance of the speculative loop on prompts cut from the held-out ids."""
    from common.reference.generate import generate
    from common.sampling import SamplingParams
    from common.speculative import Speculator
    from native.cpu_runner import CpuRunner
    runner = CpuRunner(model)
    starts = range(0, prompts * prompt_len, prompt_len)
    for k in ks:
        spec, tokens = Speculator(runner, k, auto_off=False), 0
        for start in starts:
            out = generate(runner, ids[start:start + prompt_len], SamplingParams(), gen, speculator=spec)
            tokens += len(list(out)) - 1            # the first token of each comes from the prompt's logits
        cycles = tokens - spec.accepted             # each cycle takes its accepted drafts and one more
        print(f"{model.path.name:<36} k={k}  acceptance {spec.accepted / spec.drafted:.4f} "
              f"({spec.accepted}/{spec.drafted})  tokens a cycle {tokens / cycles:.3f}  "
              f"({prompts} prompts of {prompt_len} held-out tokens, {gen} generated each)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path, nargs="+", help="GGUF files with an MTP block")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the training text; its last 10%% is scored")
    ap.add_argument("--tokens", type=int, default=4096, help="held-out tokens to score, from the start")
    ap.add_argument("--window", type=int, default=512, help="tokens per window, each from an empty state")
    ap.add_argument("--speculate", type=int, nargs="*", help="draft tokens k: run the speculative loop")
    ap.add_argument("--prompts", type=int, default=32, help="with --speculate: prompts")
    ap.add_argument("--prompt-len", type=int, default=64, help="with --speculate: tokens per prompt")
    ap.add_argument("--gen", type=int, default=64, help="with --speculate: tokens generated per prompt")
    args = ap.parse_args()

    from common.model.gguf_file import GGUFModel
    from common.model.tokenizer import Tokenizer
    from common.reference.model import ReferenceModel
    if args.speculate:
        for path in args.gguf:
            model = GGUFModel(path)
            need = args.prompts * args.prompt_len
            speculate(model, held_out_ids(Tokenizer.from_gguf(model).encode, args.data, need), args.speculate,
                      args.prompts, args.prompt_len, args.gen)
        return
    print(f"{'model':<36} {'text top-1':>10} {'greedy agreement':>17} {'positions':>9}")
    for path in args.gguf:
        model = GGUFModel(path)
        reference = ReferenceModel(model)
        if not reference.has_mtp:
            raise SystemExit(f"{path}: no MTP block")
        ids = held_out_ids(Tokenizer.from_gguf(model).encode, args.data, args.tokens)
        t0, text, greedy, n = time.time(), 0, 0, 0
        for window in windows(ids, args.window):
            if len(window) < 3:
                continue
            a, b, c = mtp_hits(reference, window)
            text, greedy, n = text + a, greedy + b, n + c
        print(f"{path.name:<36} {text / n:10.4f} {greedy / n:17.4f} {n:9d}   ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
