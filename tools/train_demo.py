"""Train the bundled demo model: Qwen3.6's architecture in miniature, on Tiny Shakespeare.

The model is transformers' `Qwen3_5MoeForCausalLM` with the real layer pattern (three Gated
DeltaNet layers to one gated full-attention layer), twice as many value heads as key heads,
partial rotary, a few routed experts (top-2) and the shared expert. The tokenizer is a byte-level
BPE with Qwen3.5's pre-tokenizer, trained on the same text. The last tenth of the text is held
out. Runs on the CPU in fp32, seeded, with a fixed thread count; writes an HF checkpoint.

    .venv/bin/python tools/train_demo.py --out build/demo-hf
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt"
HELD_OUT_FRACTION = 0.1
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3.5/3.6's split pattern, so the GGUF pre-tokenizer type is the real model's
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class DemoShape:
    vocab: int = 2048
    hidden: int = 128
    layers: int = 4
    key_heads: int = 2
    head_dim: int = 32
    attn_heads: int = 4
    kv_heads: int = 2
    experts: int = 4
    top_k: int = 2
    expert_ffn: int = 128
    shared_ffn: int = 128


@dataclass(frozen=True)
class TrainPlan:
    steps: int = 250
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 25
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 1337
    threads: int = 1  # the 2 cores are shared: one thread ran faster than two under load
    eval_every: int = 0
    device: str = "cpu"


def split_text(text: str) -> tuple[str, str]:
    cut = int(len(text) * (1 - HELD_OUT_FRACTION))
    return text[:cut], text[cut:]


def train_tokenizer(text: str, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                       "normalized": False, "single_word": False}
             for t in SPECIAL_TOKENS}
    config = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": None, "add_prefix_space": False, "added_tokens_decoder": added,
              "errors": "replace", "split_special_tokens": False, "chat_template": CHATML_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def model_config(shape: DemoShape, tok: Tokenizer) -> Qwen3_5MoeTextConfig:
    return Qwen3_5MoeTextConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(shape.layers)],
        full_attention_interval=4,
        linear_num_key_heads=shape.key_heads, linear_num_value_heads=2 * shape.key_heads,
        linear_key_head_dim=shape.head_dim, linear_value_head_dim=shape.head_dim,
        linear_conv_kernel_dim=4,
        num_attention_heads=shape.attn_heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        num_experts=shape.experts, num_experts_per_tok=shape.top_k,
        moe_intermediate_size=shape.expert_ffn, shared_expert_intermediate_size=shape.shared_ffn,
        router_aux_loss_coef=0.01, max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=[tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        pad_token_id=tok.token_to_id("<|endoftext|>"), dtype="float32",
    )


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def lr_at(step: int, plan: TrainPlan) -> float:
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    frac = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    return plan.min_lr + 0.5 * (plan.lr - plan.min_lr) * (1 + math.cos(math.pi * frac))


def lm_loss(model, x: torch.Tensor, aux: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [B, seq_len + 1] token ids
    out = model(input_ids=x[:, :-1], output_router_logits=aux, use_cache=False)
    logits = out.logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    total = ce + model.config.router_aux_loss_coef * out.aux_loss if aux else ce
    return total, ce


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, seq_len: int, batch: int) -> float:
    # ids: [N] held-out tokens, cut into non-overlapping windows
    model.eval()
    n = (len(ids) - 1) // seq_len
    windows = torch.stack([ids[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    windows = windows.to(next(model.parameters()).device)
    total = 0.0
    for i in range(0, n, batch):
        chunk = windows[i:i + batch]
        total += lm_loss(model, chunk, aux=False)[1].item() * len(chunk)
    model.train()
    return total / n


def train(model, train_ids: torch.Tensor, val_ids: torch.Tensor, plan: TrainPlan) -> float:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": plan.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=plan.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(plan.seed)
    starts_max = len(train_ids) - plan.seq_len - 1
    model.train()
    t0, smooth = time.time(), None
    for step in range(plan.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, plan)
        starts = torch.randint(0, starts_max, (plan.batch,), generator=gen)
        x = torch.stack([train_ids[s: s + plan.seq_len + 1] for s in starts.tolist()]).to(plan.device)
        total, ce = lm_loss(model, x, aux=True)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
        opt.step()
        smooth = ce.item() if smooth is None else 0.9 * smooth + 0.1 * ce.item()
        if step % 10 == 0 or step == plan.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d}/{plan.steps}  loss {ce.item():.4f}  smooth {smooth:.4f}  "
                  f"lr {lr_at(step, plan):.2e}  {el:6.0f}s  {el / (step + 1):.3f}s/step", flush=True)
        if plan.eval_every and step and step % plan.eval_every == 0:
            print(f"  held-out loss {held_out_loss(model, val_ids, plan.seq_len, plan.batch):.4f}", flush=True)
    return held_out_loss(model, val_ids, plan.seq_len, plan.batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tiny Shakespeare text file")
    ap.add_argument("--out", type=Path, default=Path("build/demo-hf"), help="HF checkpoint folder to write")
    for name, value in {**asdict(DemoShape()), **asdict(TrainPlan())}.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = ap.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"training text not found: {args.data} (pass --data PATH)")
    shape = DemoShape(**{k: getattr(args, k) for k in asdict(DemoShape())})
    plan = TrainPlan(**{k: getattr(args, k) for k in asdict(TrainPlan())})
    seed_everything(plan.seed, plan.threads)

    train_text, val_text = split_text(args.data.read_text(encoding="utf-8"))
    tok = train_tokenizer(train_text, shape.vocab)
    train_ids = torch.tensor(tok.encode(train_text).ids, dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text).ids, dtype=torch.long)
    print(f"tokens: train {len(train_ids)}  held-out {len(val_ids)}  "
          f"({len(val_text) / len(val_ids):.2f} chars/token)", flush=True)

    model = Qwen3_5MoeForCausalLM(model_config(shape, tok)).float().to(plan.device)
    print(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M", flush=True)
    val = train(model, train_ids, val_ids, plan)
    print(f"held-out loss {val:.4f} nats/token  perplexity {math.exp(val):.2f}  "
          f"{val * len(val_ids) / len(val_text):.4f} nats/char", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(args.out, safe_serialization=True)
    save_tokenizer(tok, args.out)
    run = {"shape": asdict(shape), "plan": asdict(plan), "held_out_loss": val,
           "held_out_tokens": len(val_ids), "held_out_chars": len(val_text)}
    (args.out / "train_run.json").write_text(json.dumps(run, indent=2) + "\n")
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
