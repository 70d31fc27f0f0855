"""The bundled demo model: where it is found, its shape, a pinned greedy continuation, a pinned
chat turn that thinks and calls a tool, its perplexity on a slice of the held-out text, and how
often its MTP head guesses the token after next there.

The golden ids and texts were produced by the reference model on the committed q8_0 file. A
change that breaks tokenizing, the chat template, prefill, decode, the draft step or greedy
sampling changes them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from common.model.chat_template import default_template, render_chat, template_from_gguf
from common.model.default import default_model_path
from common.model.tokenizer import Tokenizer
from common.reference.generate import generate
from common.reference.model import ReferenceModel
from common.sampling import SamplingParams
from fermium.demo import QUESTION, TOOLS, lookup_line, run_tool
from services.router.frontend.chat import ChatOutputParser
from tests.conftest import fermium_cli
from tools.eval_mtp import mtp_hits

MODELS = Path(__file__).resolve().parents[1] / "models"
HELD_OUT_SLICE = MODELS / "heldout_sample.txt"
COMMITTED_BYTES_LIMIT = 20 * 2**20   # the budget for everything under models/

PROMPT = "ROMEO:"
GOLDEN_TOKENS = 32
GOLDEN_IDS = [304, 654, 366, 326, 198, 385, 370, 11, 327, 366, 316, 264, 268, 1255, 11, 327,
              304, 696, 198, 86, 328, 264, 1366, 323, 998, 274, 40, 654, 593, 298, 11, 779]
GOLDEN_TEXT = (" I'll not be\nTheir, and not in the field, and I am\nwith the duke.\n\n"
               "ROMEO:\nI'll tell you, sir")

SLICE_TOKENS = 512
# The committed q8_0 file scores SLICE_PPL_MEASURED on this slice (models/README.md); q8_0 sits
# within 1% of f32, so 3% above the measurement is a real regression, while a broken model
# lands near the vocabulary size (2048, a uniform guess).
SLICE_PPL_MEASURED = 26.403
SLICE_PPL_BOUND = SLICE_PPL_MEASURED * 1.03


CHAT_TOKENS = 96
# the model copies the request's form, not its quoted words: a 3 M-parameter model (models/README.md)
GOLDEN_CHAT = ('The user wants the line with the words "will I be". I will look it up.\n</think>\n\n'
               "<tool_call>\n<function=lookup_line>\n<parameter=words>\nwill I be\n</parameter>\n"
               "</function>\n</tool_call>")
GOLDEN_CALL = ("lookup_line", {"words": "will I be"})

# The MTP head on the first MTP_TOKENS tokens of the slice: how often its guess is the trunk's own
# greedy choice (what greedy speculation accepts at k = 1); measured, less 5% for quantization.
MTP_TOKENS = 512
MTP_AGREEMENT_MEASURED = 0.589
MTP_AGREEMENT_BOUND = MTP_AGREEMENT_MEASURED * 0.95


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
    assert model.get("qwen35moe.nextn_predict_layers") == 1 and ReferenceModel(model).has_mtp
    assert template_from_gguf(model) == default_template()      # Qwen3.6's own chat template


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


def test_chat_turn_thinks_and_calls_a_tool(model, tokenizer):
    prompt = render_chat([{"role": "user", "content": QUESTION}], tools=TOOLS, template=template_from_gguf(model))
    end = tokenizer.encode("<|im_end|>")
    out = []
    for token in generate(ReferenceModel(model), tokenizer.encode(prompt), SamplingParams(temperature=0.0),
                          CHAT_TOKENS):
        if token in end:
            break
        out.append(token)
    text = tokenizer.decode(out)
    assert text == GOLDEN_CHAT, f"the chat turn changed: {text!r}"
    message = ChatOutputParser.parse(text, tools=TOOLS)
    assert message.reasoning_content and message.failures == 0
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [GOLDEN_CALL]


def test_mtp_head_guesses_the_token_after_next(model, tokenizer):
    ids = tokenizer.encode(HELD_OUT_SLICE.read_text(encoding="utf-8"))[:MTP_TOKENS + 1]
    text_hits, greedy_hits, positions = mtp_hits(ReferenceModel(model), ids)
    assert positions == MTP_TOKENS - 1 and text_hits > 0
    assert greedy_hits / positions >= MTP_AGREEMENT_BOUND, f"MTP agreement {greedy_hits / positions:.4f}"


def test_demo_tools_answer_from_the_held_out_sample():
    play = HELD_OUT_SLICE.read_text(encoding="utf-8")
    assert lookup_line(play, "good sir! Pray, have you") == (
        "line 11, PETRUCHIO: And you, good sir! Pray, have you not a daughter")
    # no line holds these words together: the line sharing the most of them
    assert lookup_line(play, "daughter Katharina called").startswith("line 15, BAPTISTA: I have a daughter")
    assert lookup_line(play, "zzz qqq") == "no line holds 'zzz qqq'"
    assert run_tool("count_words", {"text": "Good morrow, neighbour Baptista."}, play) == "4"
