"""Shared fixtures: tiny random transformers checkpoints and their GGUF conversions; the demo model
and its tokenizer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]


def fermium_cli(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run the `fermium` command of this checkout in a subprocess."""
    return subprocess.run([sys.executable, "-m", "fermium", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, check=check, **kwargs)


class Metadata:
    """GGUF metadata held in memory: the .get/.has that the tokenizer and template loaders read."""

    def __init__(self, **fields):
        self.fields = fields

    def get(self, key):
        return self.fields[key]

    def has(self, key):
        return key in self.fields


def tiny_config(kind: str, layers: int = 8):
    """A small model of the real architecture: 3:1 linear:full, v heads = 2 x k heads, partial RoPE."""
    import transformers as tf
    common = dict(vocab_size=320, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, initializer_range=0.08, rms_norm_eps=1e-6)
    if kind == "qwen3_5_text":      # the dense sibling: one SwiGLU FFN per layer
        return tf.Qwen3_5TextConfig(**common, intermediate_size=96), tf.Qwen3_5ForCausalLM
    common.update(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)
    if kind == "qwen3_5_moe_text":
        return tf.Qwen3_5MoeTextConfig(**common), tf.Qwen3_5MoeForCausalLM
    if kind == "qwen3_next":
        return tf.Qwen3NextConfig(**common, intermediate_size=64), tf.Qwen3NextForCausalLM
    raise ValueError(kind)


def build_tiny_checkpoint(kind: str, out_dir: Path, seed: int = 0, bland: bool = False):
    """bland=False spreads norms and gates so every code path matters; such a random net is
    chaotic, though: a 1% weight change moves its logits by tens of percent. bland=True keeps
    transformers' default init, whose smooth response suits quantization error bounds."""
    import torch
    cfg, cls = tiny_config(kind)
    if bland:
        cfg.initializer_range = 0.02
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in ([] if bland else model.named_parameters()):
            if "norm" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith(("dt_bias", "A_log")):
                p.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    return model


@pytest.fixture(scope="session", params=["qwen3_5_moe_text", "qwen3_next", "qwen3_5_text"])
def tiny_model(request, tmp_path_factory):
    """(transformers model, f32 GGUF path, checkpoint dir) for each architecture."""
    pytest.importorskip("torch")
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    model = build_tiny_checkpoint(kind, root / "hf")
    gguf_path = root / "model-f32.gguf"
    fermium_cli("convert", root / "hf", gguf_path, "--type", "f32")
    return model, gguf_path, root / "hf"


@pytest.fixture(scope="module")
def model() -> GGUFModel:
    """The demo model (common.model.default), opened once per module that asks for it."""
    return GGUFModel(default_model_path())


@pytest.fixture(scope="module")
def tok(model) -> Tokenizer:
    return Tokenizer.from_gguf(model)
