"""The MTP block in model files: bind() gives its tensors by role as BoundModel.mtp, a file without
one still loads, an incomplete one is an error naming what is missing, and the synthetic writer's
--mtp adds the block as llama.cpp writes it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from common.model.layers import FULL, MOE, NEXTN, NORMS, VECTOR_ROLES, bind

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

LAYERS = 4
OPTIONAL = {"embed_tokens", "shared_head_head"}       # Qwen3.5/3.6 share the embedding and the head


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-files")
    out = {}
    for recipe in ("q4_0", "q4_k_m", "f32"):
        out[recipe] = write_synthetic(root / f"{recipe}.gguf", layers=LAYERS, recipe=recipe, widths=TINY, mtp=True)
        out[recipe + "-plain"] = write_synthetic(root / f"{recipe}-plain.gguf", layers=LAYERS, recipe=recipe,
                                                 widths=TINY)
    out["next"] = write_synthetic(root / "next.gguf", layers=LAYERS, recipe="q8_0", widths=TINY, arch="qwen3next",
                                  mtp=True)
    return out


def test_nextn_norms_are_vector_roles():
    assert {"enorm", "hnorm", "shared_head_norm"} <= VECTOR_ROLES
    assert "eh_proj" not in VECTOR_ROLES


@pytest.mark.parametrize("recipe", ["q4_0", "q4_k_m", "f32", "next"])
def test_synthetic_mtp_binds_by_role(files, recipe):
    model = GGUFModel(files[recipe])
    cfg = model.config
    arch = cfg.arch
    assert model.get(f"{arch}.block_count") == LAYERS + 1 and model.get(f"{arch}.nextn_predict_layers") == 1
    assert (cfg.n_layers, cfg.n_nextn_layers, cfg.has_mtp) == (LAYERS, 1, True)
    bound = bind(model)
    assert len(bound.layers) == LAYERS
    roles = {s.role for s in NEXTN + NORMS + FULL + MOE if s.when(cfg)}
    assert set(bound.mtp) == roles
    for role, t in bound.mtp.items():
        assert (t is None) == (role in OPTIONAL), role
    assert bound.mtp["eh_proj"].name == f"blk.{LAYERS}.nextn.eh_proj.weight"
    assert bound.mtp["eh_proj"].shape == (TINY.hidden, 2 * TINY.hidden)
    assert bound.mtp["q"].name == f"blk.{LAYERS}.attn_q.weight"


@pytest.mark.parametrize("recipe", ["q4_0", "q4_k_m", "f32"])
def test_synthetic_mtp_is_typed_as_the_full_attention_layer_and_leaves_the_trunk(files, recipe):
    model, plain = GGUFModel(files[recipe]), GGUFModel(files[recipe + "-plain"])
    bound = bind(model)
    full = bound.layers[model.config.full_layers[-1]]
    for role, t in full.items():
        assert bound.mtp[role].qtype == t.qtype, role
    assert bound.mtp["eh_proj"].qtype == full["o"].qtype
    for name, t in plain.tensors.items():                   # the trunk's bytes do not depend on --mtp
        assert np.array_equal(model.tensors[name].raw, t.raw), name
    assert bind(plain).mtp is None and not plain.config.has_mtp


def test_a_block_counted_but_absent_still_loads(files):
    model = GGUFModel(files["q4_0"])
    for name in [n for n in model.tensors if n.startswith(f"blk.{LAYERS}.")]:
        model.tensors.pop(name)
    assert model.config.n_nextn_layers == 1 and bind(model).mtp is None


@pytest.mark.parametrize("missing", ["nextn.hnorm.weight", "attn_k.weight", "ffn_down_exps.weight"])
def test_an_incomplete_block_is_an_error_naming_it(files, missing):
    model = GGUFModel(files["q4_0"])
    model.tensors.pop(f"blk.{LAYERS}.{missing}")
    with pytest.raises(ModelConfigError) as err:
        bind(model)
    msg = str(err.value)
    assert str(model.path) in msg and f"missing tensor blk.{LAYERS}.{missing} (MTP layer {LAYERS}" in msg
    assert f"the MTP block blk.{LAYERS} is incomplete" in msg


def test_optional_nextn_tensors_may_be_absent(files):
    model = GGUFModel(files["q4_0"])
    model.tensors.pop(f"blk.{LAYERS}.nextn.shared_head_norm.weight")
    assert bind(model).mtp["shared_head_norm"] is None


def test_a_linear_mixer_in_the_block_is_unknown(files):
    model = GGUFModel(files["q4_0"])
    t = model.tensors["blk.0.attn_qkv.weight"]
    model.tensors[f"blk.{LAYERS}.attn_qkv.weight"] = t
    with pytest.raises(ModelConfigError, match=rf"unknown tensors blk\.{LAYERS}\.attn_qkv\.weight"):
        bind(model)


def test_a_block_of_one_tensor_is_called_incomplete_first(files):
    model = GGUFModel(files["q4_0"])
    for name in [n for n in model.tensors if n.startswith(f"blk.{LAYERS}.") and "eh_proj" not in n]:
        model.tensors.pop(name)
    with pytest.raises(ModelConfigError) as err:
        bind(model)
    lines = str(err.value).splitlines()
    assert lines[1].strip() == f"the MTP block blk.{LAYERS} is incomplete: a file carries all of it or none"
    assert "more" in lines[-1]                # the missing tensors, listed up to the limit
