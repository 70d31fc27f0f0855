"""The synthetic writer's recipes (tools/make_synthetic_gguf.py --type): llama-quantize's mixes
(common/model/quants/mixes.py) give each tensor the type llama.cpp would, and a small file of
every recipe loads and runs a forward pass on the reference model."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from common.model.gguf_file import GGUFModel
from common.model.quants import QUANTS, dequantize
from common.model.quants.mixes import MIXES, file_sizes
from common.reference.model import ReferenceModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import FLOAT_SMALL, REAL, RECIPES, TINY, tensor_plan, write_synthetic  # noqa: E402
from synthetic_blocks import MAKERS  # noqa: E402

ISSUE_41 = ("q2_k", "q3_k_m", "q4_k_s", "iq4_xs", "iq4_nl", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m",
         "iq1_s", "iq1_m", "mxfp4_moe", "q4_1", "q5_0", "q5_1", "tq1_0", "tq2_0", "dynamic")

# what llama.cpp's llama_tensor_get_type gives a 40-layer qwen35moe (8 query heads per KV head,
# 256 experts, an LM head of its own): (file type, tensor) -> type
LLAMA_CPP_40_LAYERS = {
    ("q3_k_m", "token_embd.weight"): T.Q3_K, ("q3_k_m", "output.weight"): T.Q6_K,
    ("q3_k_m", "blk.0.attn_qkv.weight"): T.Q5_K, ("q3_k_m", "blk.1.attn_qkv.weight"): T.Q5_K,
    ("q3_k_m", "blk.2.attn_qkv.weight"): T.Q4_K, ("q3_k_m", "blk.3.attn_v.weight"): T.Q4_K,
    ("q3_k_m", "blk.1.ffn_down_exps.weight"): T.Q5_K, ("q3_k_m", "blk.2.ffn_down_exps.weight"): T.Q4_K,
    ("q3_k_m", "blk.3.attn_output.weight"): T.Q4_K, ("q3_k_m", "blk.5.ffn_up_exps.weight"): T.Q3_K,
    ("q2_k", "blk.0.attn_qkv.weight"): T.Q4_K, ("q2_k", "blk.9.ffn_down_shexp.weight"): T.Q3_K,
    ("q2_k", "blk.7.attn_output.weight"): T.Q3_K, ("q2_k", "blk.7.ssm_out.weight"): T.Q2_K,
    ("q4_k_s", "blk.3.attn_v.weight"): T.Q5_K, ("q4_k_s", "blk.4.attn_qkv.weight"): T.Q4_K,
    ("q4_k_s", "blk.4.ffn_down_exps.weight"): T.Q5_K, ("q4_k_s", "blk.5.ffn_down_exps.weight"): T.Q4_K,
    ("iq4_xs", "blk.20.attn_qkv.weight"): T.Q5_K, ("iq4_xs", "blk.4.ffn_down_exps.weight"): T.Q5_K,
    ("iq4_xs", "blk.5.ffn_down_exps.weight"): T.IQ4_XS, ("iq4_xs", "token_embd.weight"): T.IQ4_XS,
    ("iq3_xxs", "token_embd.weight"): T.IQ3_S, ("iq3_xxs", "output.weight"): T.Q5_K,
    ("iq3_xxs", "blk.3.attn_q.weight"): T.IQ2_S, ("iq3_xxs", "blk.3.attn_output.weight"): T.IQ3_S,
    ("iq3_xxs", "blk.3.attn_v.weight"): T.Q4_K, ("iq3_xxs", "blk.0.ffn_down_exps.weight"): T.IQ3_XXS,
    ("iq2_xxs", "token_embd.weight"): T.Q2_K, ("iq2_xxs", "output.weight"): T.Q5_K,
    ("iq2_xxs", "blk.2.ffn_down_exps.weight"): T.Q2_K, ("iq2_xxs", "blk.2.ffn_down_shexp.weight"): T.IQ2_XXS,
    ("iq2_xxs", "blk.0.attn_qkv.weight"): T.Q4_K, ("iq2_xxs", "blk.3.attn_output.weight"): T.IQ2_XXS,
    ("iq2_m", "token_embd.weight"): T.IQ3_S, ("iq2_m", "blk.0.ffn_down_exps.weight"): T.IQ3_S,
    ("iq2_m", "blk.3.attn_output.weight"): T.IQ3_S, ("iq2_m", "blk.9.ffn_gate_exps.weight"): T.IQ2_S,
    ("iq2_s", "blk.9.ffn_gate_exps.weight"): T.IQ2_XS, ("iq1_m", "blk.3.attn_output.weight"): T.IQ2_XXS,
    ("iq1_s", "blk.9.ffn_up_exps.weight"): T.IQ1_S,
    ("iq2_xs", "blk.4.ffn_down.weight"): T.Q2_K, ("iq2_xs", "blk.5.ffn_down.weight"): T.IQ2_XS,   # dense
    ("mxfp4_moe", "token_embd.weight"): T.Q8_0, ("mxfp4_moe", "output.weight"): T.Q8_0,
    ("mxfp4_moe", "blk.0.ffn_up_exps.weight"): T.MXFP4, ("mxfp4_moe", "blk.0.ffn_up_shexp.weight"): T.Q8_0,
    ("tq1_0", "token_embd.weight"): T.Q4_K, ("tq1_0", "blk.0.ssm_out.weight"): T.TQ1_0,
    ("q5_0", "blk.0.ffn_down_exps.weight"): T.Q5_0, ("q4_1", "output.weight"): T.Q6_K,
}


@pytest.mark.parametrize("key", sorted(LLAMA_CPP_40_LAYERS), ids="/".join)
def test_the_mixes_choose_what_llama_quantize_does(key):
    ftype, name = key
    assert MIXES[ftype].type_of(name, 40) == LLAMA_CPP_40_LAYERS[key]


def test_the_dynamic_mix_mixes_k_quants_with_iq4_xs_and_mxfp4():
    types = {MIXES["dynamic"].type_of(name, 40) for name, shape, _ in tensor_plan(REAL, 40, 4) if len(shape) > 1}
    assert {T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.IQ4_XS, T.MXFP4} <= types


def test_file_sizes_price_each_tensor_and_order_the_mixes():
    plan = tensor_plan(REAL, 40, 4)
    sizes = file_sizes((name, shape, 4 * int(np.prod(shape))) for name, shape, _ in plan)
    assert sizes["f32"] == 4 * sum(int(np.prod(shape)) for _, shape, _ in plan)
    order = ["iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_m", "q2_k", "iq3_xxs", "q3_k_m", "iq4_xs", "q4_k_m",
             "q5_k_m", "q6_k", "q8_0", "f16", "f32"]
    assert [sizes[n] for n in order] == sorted(sizes[n] for n in order)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_small_file_of_each_recipe_runs_on_the_reference(tmp_path, recipe):
    path = write_synthetic(tmp_path / f"{recipe}.gguf", layers=4, recipe=recipe, widths=TINY)
    model = GGUFModel(path)
    # the test files' own recipes are no mixes: their Q4_K_M is older than the mixes, the others
    # rotate a family of types through the tensors
    if recipe in MIXES and recipe != "q4_k_m":
        for name, t in model.tensors.items():
            if len(t.shape) > 1 and not name.endswith((*FLOAT_SMALL, "ssm_conv1d.weight")):
                assert t.qtype == MIXES[recipe].type_of(name, 4), name
    ref = ReferenceModel(model)
    logits = ref.prefill(list(range(1, 9)), ref.new_state(), all_logits=True)
    assert logits.shape == (8, TINY.vocab) and np.isfinite(logits).all() and logits.std() > 0


def test_every_recipe_the_issue_names_is_written():
    assert set(ISSUE_41) <= set(RECIPES)


@pytest.mark.parametrize("qtype", sorted(QUANTS, key=lambda q: q.name), ids=lambda q: q.name)
def test_random_blocks_have_the_asked_spread(qtype):
    """Each type's random blocks: values of about the asked standard deviation, centred, finite;
    ternary blocks hold only -d, 0 and d."""
    std = 0.02
    raw = MAKERS[qtype](np.random.default_rng(5), 64, 1024, std)
    values = dequantize(raw.reshape(64, -1), qtype)                     # (64, 1024)
    assert np.isfinite(values).all()
    assert 0.85 * std < values.std() < 1.15 * std and abs(values.mean()) < 0.15 * std
    if qtype in (T.TQ1_0, T.TQ2_0):
        blocks = values.reshape(-1, 256)
        d = np.abs(blocks).max(axis=1, keepdims=True)
        assert np.all((blocks == 0) | (np.abs(blocks) == d))
