"""Train the bundled demo model: Qwen3.6's architecture in miniature, on Tiny Shakespeare.

The model is transformers' `Qwen3_5MoeForCausalLM` with the real layer pattern (three Gated
DeltaNet layers to one gated full-attention layer), twice as many value heads as key heads,
partial rotary, a few routed experts (top-2) and the shared expert, plus Qwen's MTP block
(`mtp.*`: one full-attention MoE layer that predicts the token after next), trained with the
main loss as DeepSeek-V3 and Qwen do: loss = LM loss + mtp_weight * MTP loss.

Each batch mixes plain windows of the play with chat conversations made from it
(tools/demo_data.py), rendered with Qwen3.6's template: think blocks and XML tool calls. The
tokenizer is a byte-level BPE with Qwen3.5's pre-tokenizer, trained on the same mix, with the
template's tags as single tokens. The last tenth of the text is held out. Runs on the CPU in
fp32, seeded, with a fixed thread count; writes an HF checkpoint that carries Qwen3.6's template.

    .venv/bin/python tools/train_demo.py --out build/demo-hf
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from tools.demo_data import IGNORE, chat_rows, conversations, render
from tools.demo_mtp import MtpBlock
from tools.demo_tokenizer import ADDED_TOKENS, TEMPLATE, save_tokenizer, train_tokenizer  # noqa: F401

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt"
HELD_OUT_FRACTION = 0.1


@dataclass(frozen=True)
class DemoShape:
    vocab: int = 2048
    hidden: int = 160
    layers: int = 4
    key_heads: int = 2
    head_dim: int = 32
    attn_heads: int = 4
    kv_heads: int = 2
    experts: int = 4
    top_k: int = 2
    expert_ffn: int = 160
    shared_ffn: int = 160


@dataclass(frozen=True)
class TrainPlan:
    steps: int = 480
    batch: int = 16          # rows a step: plain windows, then chat_rows conversations
    chat_rows: int = 6
    seq_len: int = 256
    chat_len: int = 480      # a conversation with the tools' system prompt is longer than a window
    chats: int = 8000        # conversations drawn from the training text
    tokenizer_chats: int = 1000  # of those, the ones the BPE also learns from (the rest repeat them)
    mtp_weight: float = 0.3  # the MTP loss's weight in the total (DeepSeek-V3 uses 0.3, then 0.1)
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 30
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 1337
    threads: int = 1  # the 2 cores are shared: one thread ran faster than two under load
    eval_every: int = 0
    device: str = "cpu"


def split_text(text: str) -> tuple[str, str]:
    cut = int(len(text) * (1 - HELD_OUT_FRACTION))
    return text[:cut], text[cut:]


def model_config(shape: DemoShape, tok: Tokenizer) -> Qwen3_5MoeTextConfig:
    config = Qwen3_5MoeTextConfig(
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
    config.mtp_num_hidden_layers = 1
    return config


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


# ---- losses
def losses(model, mtp: MtpBlock, x: torch.Tensor, labels: torch.Tensor | None,
           aux: bool) -> dict[str, torch.Tensor]:
    """LM, MTP and router losses of a batch. x: [B, T + 1] ids; labels: like x (None: all)."""
    labels = x if labels is None else labels
    out = model.model(input_ids=x[:, :-1], output_router_logits=aux, use_cache=False)
    hidden = out.last_hidden_state                          # [B, T, H], after the final norm
    logits = model.lm_head(hidden).float()
    vocab = logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels[:, 1:].reshape(-1),
                                           ignore_index=IGNORE)
    # position i: the embedding of x_{i+1} and the trunk's h_i predict x_{i+2}
    mtp_hidden = mtp(model, x[:, 1:-1], hidden[:, :-1])     # [B, T - 1, H]
    mtp_logits = model.lm_head(mtp_hidden).float()
    mtp_ce = torch.nn.functional.cross_entropy(mtp_logits.reshape(-1, vocab), labels[:, 2:].reshape(-1),
                                               ignore_index=IGNORE)
    with torch.no_grad():
        targets = labels[:, 2:]
        kept = targets != IGNORE
        top1 = (mtp_logits.argmax(-1) == targets)[kept].float().mean()
    result = {"ce": ce, "mtp": mtp_ce, "mtp_top1": top1}
    if aux:
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import load_balancing_loss_func
        result["aux"] = load_balancing_loss_func(out.router_logits, model.num_experts,
                                                 model.num_experts_per_tok, None)
    return result


@torch.no_grad()
def held_out(model, mtp: MtpBlock, ids: torch.Tensor, seq_len: int, batch: int) -> tuple[float, float, float]:
    """Mean LM loss, MTP loss and MTP top-1 accuracy (the token after next) on held-out windows."""
    model.eval()
    mtp.eval()
    n = (len(ids) - 1) // seq_len
    windows = torch.stack([ids[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    windows = windows.to(next(model.parameters()).device)
    ce = mtp_ce = hits = 0.0
    for i in range(0, n, batch):
        x = windows[i:i + batch]
        result = losses(model, mtp, x, None, aux=False)
        ce += result["ce"].item() * len(x)
        mtp_ce += result["mtp"].item() * len(x)
        hits += result["mtp_top1"].item() * len(x)
    model.train()
    mtp.train()
    return ce / n, mtp_ce / n, hits / n


def train(model, mtp: MtpBlock, train_ids: torch.Tensor, chats: tuple[torch.Tensor, torch.Tensor],
          val_ids: torch.Tensor, plan: TrainPlan) -> tuple[float, float, float]:
    params = dict(model.named_parameters()) | {f"mtp.{n}": p for n, p in mtp.named_parameters()}
    decay = [p for n, p in params.items() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in params.items() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": plan.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=plan.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(plan.seed)
    starts_max = len(train_ids) - plan.seq_len - 1
    chat_ids, chat_labels = chats
    plain_rows = plan.batch - plan.chat_rows
    model.train()
    t0, smooth = time.time(), None
    for step in range(plan.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, plan)
        starts = torch.randint(0, starts_max, (plain_rows,), generator=gen)
        picks = torch.randint(0, len(chat_ids), (plan.chat_rows,), generator=gen)
        x = torch.stack([train_ids[s: s + plan.seq_len + 1] for s in starts.tolist()]).to(plan.device)
        plain = losses(model, mtp, x, None, aux=True)
        chat = losses(model, mtp, chat_ids[picks].to(plan.device), chat_labels[picks].to(plan.device), aux=True)
        share = plan.chat_rows / plan.batch
        ce = (1 - share) * plain["ce"] + share * chat["ce"]
        mtp_ce = (1 - share) * plain["mtp"] + share * chat["mtp"]
        aux = (1 - share) * plain["aux"] + share * chat["aux"]
        total = ce + plan.mtp_weight * mtp_ce + model.config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), plan.clip)
        opt.step()
        smooth = plain["ce"].item() if smooth is None else 0.9 * smooth + 0.1 * plain["ce"].item()
        if step % 10 == 0 or step == plan.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d}/{plan.steps}  text {plain['ce'].item():.4f} (smooth {smooth:.4f})  "
                  f"chat {chat['ce'].item():.4f}  mtp {plain['mtp'].item():.4f}/{chat['mtp'].item():.4f}  "
                  f"lr {lr_at(step, plan):.2e}  {el:6.0f}s  {el / (step + 1):.3f}s/step", flush=True)
        if plan.eval_every and step and step % plan.eval_every == 0:
            print("  held-out loss %.4f  mtp %.4f  mtp top-1 %.4f"
                  % held_out(model, mtp, val_ids, plan.seq_len, plan.batch), flush=True)
    return held_out(model, mtp, val_ids, plan.seq_len, plan.batch)


def save_checkpoint(model, mtp: MtpBlock, tok: Tokenizer, out: Path) -> None:
    """The HF checkpoint with the MTP block's weights under mtp.*, as Qwen's checkpoints carry them."""
    from safetensors.torch import load_file, save_file
    out.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(out, safe_serialization=True)
    weights = out / "model.safetensors"
    tensors = load_file(weights)
    tensors |= {f"mtp.{n}": t.detach().cpu().contiguous() for n, t in mtp.state_dict().items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    save_tokenizer(tok, out)


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
    rendered = [render(m, t) for m, t in conversations(train_text, plan.chats, plan.seed)]
    tok = train_tokenizer([train_text] + rendered[:plan.tokenizer_chats], shape.vocab)
    train_ids = torch.tensor(tok.encode(train_text).ids, dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text).ids, dtype=torch.long)
    chats = chat_rows(tok, train_text, plan)
    print(f"tokens: train {len(train_ids)}  held-out {len(val_ids)}  "
          f"({len(val_text) / len(val_ids):.2f} chars/token)  conversations {len(chats[0])} "
          f"({(chats[1] != IGNORE).sum().item()} trained tokens)", flush=True)

    config = model_config(shape, tok)
    model = Qwen3_5MoeForCausalLM(config).float().to(plan.device)
    mtp = MtpBlock(config).to(plan.device)
    mtp.apply(model._init_weights)
    print(f"parameters: trunk {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M  "
          f"mtp {sum(p.numel() for p in mtp.parameters()) / 1e6:.2f} M", flush=True)
    val, val_mtp, mtp_top1 = train(model, mtp, train_ids, chats, val_ids, plan)
    print(f"held-out loss {val:.4f} nats/token  perplexity {math.exp(val):.2f}  "
          f"{val * len(val_ids) / len(val_text):.4f} nats/char  mtp loss {val_mtp:.4f}  "
          f"mtp top-1 {mtp_top1:.4f}", flush=True)

    save_checkpoint(model, mtp, tok, args.out)
    run = {"shape": asdict(shape), "plan": asdict(plan), "held_out_loss": val, "held_out_mtp_loss": val_mtp,
           "held_out_mtp_top1": mtp_top1, "held_out_tokens": len(val_ids), "held_out_chars": len(val_text)}
    (args.out / "train_run.json").write_text(json.dumps(run, indent=2) + "\n")
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
