"""`fermium convert --mmproj`: a tiny Qwen3.5 VL checkpoint's vision tower to llama.cpp's mmproj layout,
checked tensor by tensor against the checkpoint, and read back through the binding."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from common.model.config import ModelConfigError
from common.model.convert import ConvertError
from common.model.convert.mmproj import convert_mmproj
from common.model.gguf_file import GGUFModel
from common.vision.tensors import MmprojFile
from tests.conftest import fermium_cli

from .vision_helpers import TinyVL

pytest.importorskip("torch")
pytest.importorskip("transformers")

DEPTH, HIDDEN_V, FFN_V, TEXT_HIDDEN = 2, 32, 48, 64


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    return TinyVL(tmp_path_factory.mktemp("vl"))


def expected(hf: dict) -> dict[str, np.ndarray]:
    v = "model.visual."
    out = {"v.patch_embd.weight": hf[v + "patch_embed.proj.weight"][:, :, 0],
           "v.patch_embd.weight.1": hf[v + "patch_embed.proj.weight"][:, :, 1],
           "v.patch_embd.bias": hf[v + "patch_embed.proj.bias"],
           "v.position_embd.weight": hf[v + "pos_embed.weight"]}
    for kind in ("weight", "bias"):
        out[f"v.post_ln.{kind}"] = hf[f"{v}merger.norm.{kind}"]
        out[f"mm.0.{kind}"] = hf[f"{v}merger.linear_fc1.{kind}"]
        out[f"mm.2.{kind}"] = hf[f"{v}merger.linear_fc2.{kind}"]
        for i in range(DEPTH):
            b = f"{v}blocks.{i}."
            for ours, theirs in (("attn_qkv", "attn.qkv"), ("attn_out", "attn.proj"), ("ffn_up", "mlp.linear_fc1"),
                                 ("ffn_down", "mlp.linear_fc2"), ("ln1", "norm1"), ("ln2", "norm2")):
                out[f"v.blk.{i}.{ours}.{kind}"] = hf[f"{b}{theirs}.{kind}"]
    return out


def test_every_tensor_is_the_checkpoints(tiny_vl):
    from safetensors.numpy import load_file
    hf = load_file(tiny_vl.hf_dir / "model.safetensors")
    exp = expected(hf)
    model = GGUFModel(tiny_vl.mmproj_path)
    assert set(model.tensors) == set(exp)
    for name, value in exp.items():
        assert model.tensors[name].shape == value.shape, name
        assert np.array_equal(model.f32(name), value), name


def test_metadata_is_llama_cpps(tiny_vl):
    m = GGUFModel(tiny_vl.mmproj_path)
    assert m.get("general.architecture") == "clip" and m.get("general.type") == "mmproj"
    assert m.get("clip.projector_type") == "qwen3vl_merger"
    assert (m.get("clip.vision.embedding_length"), m.get("clip.vision.feed_forward_length"),
            m.get("clip.vision.block_count"), m.get("clip.vision.attention.head_count")) == (HIDDEN_V, FFN_V, DEPTH, 2)
    assert m.get("clip.vision.projection_dim") == TEXT_HIDDEN
    assert m.get("clip.vision.image_size") == 6 * 16          # sqrt(36 positions) patches of 16
    assert m.get("clip.vision.is_deepstack_layers") == [False] * DEPTH
    cfg = MmprojFile(tiny_vl.mmproj_path).config
    assert (cfg.patch_size, cfg.merge_size, cfg.grid_side, cfg.factor) == (16, 2, 6, 32)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("out_type,patch,matrix,odd_row", [("f16", "F16", "F16", "F16"),
                                                          ("bf16", "F32", "BF16", "BF16"),
                                                          ("q8_0", "F32", "Q8_0", "F16")])
def test_types_as_llama_cpp_gives_them(tiny_vl, tmp_path, out_type, patch, matrix, odd_row):
    out = convert_mmproj(tiny_vl.hf_dir, tmp_path / "m.gguf", out_type, progress=False)
    m = GGUFModel(out.path)
    kinds = {name: t.qtype.name for name, t in m.tensors.items()}
    assert kinds["v.patch_embd.weight"] == kinds["v.patch_embd.weight.1"] == patch
    assert kinds["v.position_embd.weight"] == "F32"
    assert kinds["v.blk.0.attn_qkv.weight"] == kinds["mm.0.weight"] == matrix
    assert kinds["v.blk.0.ffn_down.weight"] == odd_row         # rows of 48: not whole Q8_0 blocks
    assert all(kinds[n] == "F32" for n in kinds if n.endswith(".bias") or ".ln" in n or "post_ln" in n)
    assert MmprojFile(out.path).bound.blocks[1]["down_w"].shape == (HIDDEN_V, FFN_V)


def test_the_cli_writes_both_files(tiny_vl, tmp_path):
    proc = fermium_cli("convert", tiny_vl.hf_dir, tmp_path / "text.gguf", "--type", "f32", "-q",
                       "--mmproj", tmp_path / "mmproj.gguf", "--mmproj-type", "f32")
    assert "clip" in proc.stdout and "qwen35moe" in proc.stdout
    ours, theirs = GGUFModel(tmp_path / "mmproj.gguf"), GGUFModel(tiny_vl.mmproj_path)
    assert all(np.array_equal(ours.tensors[n].raw, t.raw) for n, t in theirs.tensors.items())
    text = GGUFModel(tmp_path / "text.gguf")
    assert not any(n.startswith("v.") for n in text.tensors)
    assert text.config.rope_sections == (3, 3, 2, 0)
    bad = fermium_cli("convert", tiny_vl.hf_dir, tmp_path / "t2.gguf", "--mmproj", tmp_path / "m2.gguf",
                      "--mmproj-type", "q4_0", check=False)
    assert bad.returncode != 0 and "--mmproj-type" in bad.stderr


def test_a_checkpoint_without_the_image_normalisation_is_refused(tiny_vl, tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(tiny_vl.hf_dir, src)
    (src / "preprocessor_config.json").unlink()
    with pytest.raises(ConvertError, match="image_mean"):
        convert_mmproj(src, tmp_path / "m.gguf", progress=False)
    assert not (tmp_path / "m.gguf").exists()


def test_a_text_only_checkpoint_has_no_mmproj(tiny_vl, tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(tiny_vl.hf_dir, src)
    config = json.loads((src / "config.json").read_text())
    del config["vision_config"]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="no vision_config"):
        convert_mmproj(src, tmp_path / "m.gguf", progress=False)


def test_the_binding_names_a_missing_tensor(tiny_vl, tmp_path):
    from gguf import GGUFWriter
    src = GGUFModel(tiny_vl.mmproj_path)
    writer = GGUFWriter(tmp_path / "cut.gguf", "clip")
    for key in src.keys():
        if not key.startswith(("GGUF.", "general.architecture")):
            value = src.get(key)
            if isinstance(value, list):
                writer.add_array(key, value)
            elif isinstance(value, bool):
                writer.add_bool(key, value)
            elif isinstance(value, int):
                writer.add_uint32(key, value)
            elif isinstance(value, float):
                writer.add_float32(key, value)
            else:
                writer.add_string(key, value)
    for name, t in src.tensors.items():
        if name != "v.blk.1.attn_qkv.bias":
            writer.add_tensor(name, t.dequant())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelConfigError, match=r"missing tensor v\.blk\.1\.attn_qkv\.bias \(block 1"):
        MmprojFile(tmp_path / "cut.gguf").bound


def test_a_text_model_file_is_not_an_mmproj(tiny_vl):
    with pytest.raises(ModelConfigError, match="missing tensor 'v.position_embd.weight'"):
        MmprojFile(tiny_vl.text_path).config
