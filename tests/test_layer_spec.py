"""The layer specification (common/model/layers.py): both architectures bind by role, a file with
an MTP block loads and runs as its trunk alone, and a missing tensor, a wrong shape or an unknown
tensor is one error, raised by every runner, that names the file, the tensor and the shapes."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from common.model.config import ModelConfig, ModelConfigError
from common.model.gguf_file import GGUFModel, Tensor
from common.model.layers import FULL, GLOBALS, MOE, NEXTN, NORMS, bind, layer_specs
from common.reference.model import ReferenceModel
from native.cpu_runner import CpuRunner
from services.prefill.backends import cuda as cuda_backend

from .conftest import Metadata
from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import TinySpec, build
from .stack_helpers import write_tiny_gguf

ARCHES = ["qwen35moe", "qwen3next"]
# the same file with and without its MTP block runs the same float32 ops in the same order
MTP_LOGITS_ATOL = 0.0


def tiny(arch: str, path) -> GGUFModel:
    if arch == "qwen35moe":
        return GGUFModel(write_tiny_gguf(path / "tiny.gguf"))
    return GGUFModel(build(path / "tiny.gguf", TinySpec(arch=arch)))


@pytest.fixture(params=ARCHES)
def model(request, tmp_path) -> GGUFModel:
    return tiny(request.param, tmp_path)


def cuda_on_emulator(model, monkeypatch):
    emulate_cuda(monkeypatch)
    return cuda_backend.CUDABackend(model, max_context=64, vram_budget=1 << 40)


RUNNERS = {
    "reference": lambda model, mp: ReferenceModel(model),
    "cpu": lambda model, mp: CpuRunner(model, threads=1, prefault=False, repack=False),
    "cuda": cuda_on_emulator,
}


def test_both_architectures_bind_by_role(model):
    cfg = model.config
    bound = bind(model)
    assert len(bound.layers) == cfg.n_layers
    assert bound.globals["head"] is model.tensor("output.weight")
    linear, full = bound.layers[cfg.linear_layers[0]], bound.layers[cfg.full_layers[0]]
    fused = cfg.arch == "qwen3next"
    assert cfg.fused_ba == fused and cfg.v_head_layout == ("grouped" if fused else "tiled")
    assert (linear.get("ba") is not None) == fused
    assert (linear.get("alpha") is not None) == (not fused)
    assert linear["qkv"] is model.tensor(f"blk.{cfg.linear_layers[0]}.attn_qkv.weight")
    assert full["q"].name == f"blk.{cfg.full_layers[0]}.attn_q.weight" and "qkv" not in full
    for tensors in bound.layers:
        assert all(t is not None for t in tensors.values())       # every tiny file has them all


def _problem(model, edit) -> str:
    edit(model.tensors)
    with pytest.raises(ModelConfigError) as err:
        bind(model)
    msg = str(err.value)
    assert str(model.path) in msg and msg.count("\n") == 1, msg      # one problem, one line under the file
    return msg


def test_missing_tensor(model):
    msg = _problem(model, lambda ts: ts.pop("blk.1.attn_gate.weight"))
    cfg = model.config
    assert "missing tensor blk.1.attn_gate.weight" in msg
    assert f"expected shape {(cfg.n_v_heads * cfg.head_v_dim, cfg.hidden_size)}" in msg


def test_wrong_shape(model):
    def swap(ts):
        t = ts["blk.3.attn_k.weight"]
        ts["blk.3.attn_v.weight"] = Tensor("blk.3.attn_v.weight", t.qtype, (t.shape[0] // 2, t.shape[1]),
                                           t.raw[:t.shape[0] // 2])
    msg = _problem(model, swap)
    cfg = model.config
    kv = cfg.n_kv_heads * cfg.head_dim
    assert (f"tensor blk.3.attn_v.weight (full layer 3, role v) has shape {(kv // 2, cfg.hidden_size)}, "
            f"expected {(kv, cfg.hidden_size)}") in msg


def test_unknown_tensor_is_the_other_architectures(model):
    # a qwen35moe file with a fused ssm_ba, or a qwen3next file with ssm_alpha
    other = "ssm_alpha.weight" if model.config.fused_ba else "ssm_ba.weight"

    def add(ts):
        t = ts["blk.0.attn_norm.weight"]
        ts[f"blk.0.{other}"] = Tensor(f"blk.0.{other}", t.qtype, t.shape, t.raw)
        ts["blk.9.attn_norm.weight"] = Tensor("blk.9.attn_norm.weight", t.qtype, t.shape, t.raw)
    msg = _problem(model, add)
    assert f"unknown tensors blk.0.{other}, blk.9.attn_norm.weight" in msg


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_raises_the_one_error(tmp_path, monkeypatch, runner):
    model = tiny("qwen3next", tmp_path)
    model.tensors.pop("blk.0.ssm_ba.weight")
    with pytest.raises(ModelConfigError, match=r"tiny\.gguf: the tensors do not match the qwen3next "
                                               r"layer specification.*\n  missing tensor blk\.0\.ssm_ba\.weight"):
        RUNNERS[runner](model, monkeypatch)


def test_a_qwen35moe_file_may_lack_the_head_and_the_shared_gate(tmp_path):
    model = tiny("qwen35moe", tmp_path)
    for name in ["output.weight", *(f"blk.{i}.ffn_gate_inp_shexp.weight" for i in range(4))]:
        model.tensors.pop(name)
    bound = bind(model)
    assert bound.globals["head"] is model.tensor("token_embd.weight")
    assert bound.layers[0]["sh_gate_inp"] is None


# ---- a file written from the specification itself, with and without an MTP block

KEYS = {"context_length": 256, "embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 16, "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_count": 4,
        "rope.freq_base": 1e4, "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.state_size": 16,
        "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 64, "expert_count": 4,
        "expert_used_count": 2, "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 32}
VOCAB = 96


def write_from_spec(path, arch: str, mtp: bool) -> GGUFModel:
    """Every tensor the specification lists for a 4-layer trunk, and an MTP block (a full-attention
    MoE layer and the nextn tensors) when `mtp`. The trunk's weights do not depend on `mtp`."""
    keys = {**KEYS, "block_count": 5 if mtp else 4, "nextn_predict_layers": int(mtp)}
    meta = Metadata(**{f"{arch}.{k}": v for k, v in keys.items()}, **{"general.architecture": arch})
    cfg = ModelConfig.from_gguf_fields(meta.get, meta.has, path, VOCAB)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)

    def add(name: str, shape: tuple[int, ...]) -> None:
        v = rng.standard_normal(shape).astype(np.float32) * 0.3
        w.add_tensor(name, -np.exp(v) if name.endswith("ssm_a") else v)

    for s in GLOBALS:
        add(s.suffix, s.shape(cfg))
    for i in range(4):
        for s in layer_specs(cfg, i):
            add(f"blk.{i}.{s.suffix}", s.shape(cfg))
    if mtp:
        for s in NEXTN + NORMS + FULL + MOE:
            if s.when(cfg):
                add(f"blk.4.{s.suffix}", s.shape(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFModel(path)


@pytest.mark.parametrize("arch", ARCHES)
def test_an_mtp_block_loads_and_the_trunk_ignores_it(tmp_path, arch):
    plain = write_from_spec(tmp_path / "plain.gguf", arch, mtp=False)
    with_mtp = write_from_spec(tmp_path / "mtp.gguf", arch, mtp=True)
    assert with_mtp.config.n_layers == 4 and with_mtp.config.n_nextn_layers == 1
    assert len(bind(with_mtp).layers) == 4
    ids = [1, 5, 9, 3, 2, 60, 7, 95]
    for make in (ReferenceModel, lambda m: CpuRunner(m, threads=1, prefault=False, repack=False)):
        a, b = make(plain), make(with_mtp)
        want = a.prefill(ids, a.new_state(), all_logits=True)
        got = b.prefill(ids, b.new_state(), all_logits=True)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, atol=MTP_LOGITS_ATOL, rtol=0)


def test_mtp_tensors_are_checked_too(tmp_path):
    model = write_from_spec(tmp_path / "mtp.gguf", "qwen35moe", mtp=True)
    t = model.tensors["blk.4.nextn.enorm.weight"]
    model.tensors["blk.4.nextn.eh_proj.weight"] = t
    with pytest.raises(ModelConfigError, match=r"blk\.4\.nextn\.eh_proj\.weight \(MTP layer 4, role eh_proj\) "
                                               r"has shape \(64,\), expected \(64, 128\)"):
        bind(model)
