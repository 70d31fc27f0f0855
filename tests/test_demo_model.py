"""The bundled demo model: where it is found, its shape, a pinned greedy continuation, and its
perplexity on a slice of the held-out text.

The golden ids were produced by the reference model on the committed q8_0 file. A change that
breaks tokenizing, prefill, decode or greedy sampling changes them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.generate import generate
from common.reference.model import ReferenceModel
from common.sampling import SamplingParams
from tests.conftest import fermium_cli

MODELS = Path(__file__).resolve().parents[1] / "models"
HELD_OUT_SLICE = MODELS / "heldout_sample.txt"
COMMITTED_BYTES_LIMIT = 20 * 2**20   # the budget for everything under models/

PROMPT = "ROMEO:"
GOLDEN_TOKENS = 32
GOLDEN_IDS = [295, 466, 325, 308, 198, 358, 318, 11, 302, 295, 364, 826, 258, 465, 300, 293,
              288, 453, 673, 916, 268, 476, 11, 543, 323, 325, 372, 288, 453, 673, 916, 268]
GOLDEN_TEXT = (" I'll not be\nTheir, and I have been a man of you.\n\n"
               "KING RICHARD III:\nWhat, let's not so.\n\nKING RICHARD III:\n")

SLICE_TOKENS = 512
# The committed q8_0 file scores SLICE_PPL_MEASURED on this slice (models/README.md); q8_0 sits
# within 1% of f32, so 3% above the measurement is a real regression, while a broken model
# lands near the vocabulary size (2048, a uniform guess).
SLICE_PPL_MEASURED = 31.633
SLICE_PPL_BOUND = SLICE_PPL_MEASURED * 1.03


@pytest.fixture(scope="module")
def model() -> GGUFModel:
    return GGUFModel(default_model_path())


@pytest.fixture(scope="module")
def tokenizer(model) -> Tokenizer:
    return Tokenizer.from_gguf(model)


def test_default_path_is_the_committed_q8_0(model):
    path = default_model_path()
    assert path.parent == MODELS and path.name.endswith("-q8_0.gguf")
    total = sum(p.stat().st_size for p in MODELS.iterdir() if p.is_file())
    assert total < COMMITTED_BYTES_LIMIT, f"models/ holds {total / 2**20:.1f} MiB"


def test_the_real_architecture_in_miniature(model):
    cfg = model.config
    assert cfg.arch == "qwen35moe"
    assert cfg.full_attention_interval == 4 and cfg.full_layers == [3] and cfg.linear_layers == [0, 1, 2]
    assert cfg.n_v_heads == 2 * cfg.n_k_heads
    assert cfg.rope_dim * 4 == cfg.head_dim
    assert cfg.n_experts_used == 2 and cfg.n_experts > cfg.n_experts_used and cfg.shared_ffn > 0


def test_greedy_continuation_is_pinned(model, tokenizer):
    reference = ReferenceModel(model)
    prompt_ids = tokenizer.encode(PROMPT)
    out = list(generate(reference, prompt_ids, SamplingParams(temperature=0.0), GOLDEN_TOKENS))
    assert out == GOLDEN_IDS, f"greedy continuation changed: {tokenizer.decode(out)!r}"
    assert tokenizer.decode(out) == GOLDEN_TEXT


def test_cli_generate_uses_the_demo_model_by_default():
    proc = fermium_cli("generate", "--prompt", PROMPT, "--max-tokens", "8", "--json")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["tokens"] == GOLDEN_IDS[:8]


def test_held_out_slice_perplexity(model, tokenizer):
    ids = tokenizer.encode(HELD_OUT_SLICE.read_text(encoding="utf-8"))[:SLICE_TOKENS + 1]
    assert len(ids) == SLICE_TOKENS + 1
    reference = ReferenceModel(model)
    logits = reference.prefill(ids[:-1], reference.new_state(), all_logits=True).astype(np.float64)
    # logits: [SLICE_TOKENS, vocab]
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    ppl = math.exp(-logp[np.arange(SLICE_TOKENS), ids[1:]].mean())
    assert ppl < SLICE_PPL_BOUND, f"held-out slice perplexity {ppl:.3f} >= bound {SLICE_PPL_BOUND:.3f}"
