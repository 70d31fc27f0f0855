"""`fermium convert`: tiny random transformers checkpoints -> GGUF, checked tensor by tensor."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.convert import ConvertError, convert
from common.model.convert.hf_reader import read_header
from common.model.gguf_file import GGUFModel
from common.model.layers import bind

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[1]
NK, NV, DK, DV, HIDDEN, LAYERS, EXPERTS = 2, 4, 16, 16, 64, 4, 8
SSM_A_ULPS = 2e-7           # -exp(A_log) in float32: llama.cpp's torch.exp may differ by an ulp
Q8_0_REL_RMS = 0.01         # 8-bit blocks of 32: about 0.4% of the signal RMS on gaussian rows
Q4_0_REL_RMS = 0.12         # 4-bit blocks of 32: about 9%
Q4_K_M_REL_RMS = 0.10       # mostly Q4_K (about 7%), some Q5_K/Q6_K/Q8_0

KINDS = ["qwen3_5_moe_text", "qwen3_next", "qwen3_5_text"]
TILED = ("qwen3_5_moe_text", "qwen3_5_text")      # V heads reordered to tiled, in_proj_qkv + in_proj_z


def _config(kind: str, hidden: int = HIDDEN, layers: int = LAYERS, ffn: int = 32,
            experts: int = EXPERTS):
    common = dict(vocab_size=300, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  linear_conv_kernel_dim=4, linear_key_head_dim=DK, linear_value_head_dim=DV,
                  linear_num_key_heads=NK, linear_num_value_heads=NV, eos_token_id=282)
    if kind == "qwen3_5_text":
        return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**common, intermediate_size=3 * ffn))
    common.update(moe_intermediate_size=ffn, shared_expert_intermediate_size=ffn, num_experts=experts,
                  num_experts_per_tok=2)
    if kind == "qwen3_5_moe_text":
        return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**common))
    return transformers.Qwen3NextForCausalLM(
        transformers.Qwen3NextConfig(**common, intermediate_size=2 * ffn))


def write_tiny_tokenizer(d: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                         "<|im_end|>\n{% endfor %}"}))


def build_checkpoint(kind: str, d: Path, seed: int = 0, tokenizer: bool = True, **kw):
    torch.manual_seed(seed)
    model = _config(kind, **kw)
    with torch.no_grad():
        for p in model.parameters():      # every tensor random, so every transform is visible
            p.normal_(0.0, 0.5)
    model.save_pretrained(d)
    if tokenizer:
        write_tiny_tokenizer(d)
    from safetensors.numpy import load_file
    return load_file(d / "model.safetensors")        # the names as saved: experts one by one


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """kind -> (HF state dict, checkpoint dir, f32 GGUFModel)."""
    out = {}
    for kind in KINDS:
        root = tmp_path_factory.mktemp(kind)
        hf = build_checkpoint(kind, root / "hf")
        convert(root / "hf", root / "f32.gguf", "f32", progress=False)
        out[kind] = (hf, root / "hf", GGUFModel(root / "f32.gguf"))
    return out


# ---- expected values, written independently of the converter's own transforms

def tiled_rows(nk: int, nv: int, head_dim: int) -> np.ndarray:
    """Row order of a tiled V-head axis: tiled head j*nk + k is grouped head k*r + j."""
    r = nv // nk
    src = [(p % nk) * r + p // nk for p in range(nv)]
    return np.array([h * head_dim + i for h in src for i in range(head_dim)])


def expected_tensors(kind: str, hf: dict) -> dict[str, np.ndarray]:
    tiled = kind in TILED
    vrows = tiled_rows(NK, NV, DV) if tiled else np.arange(NV * DV)
    vheads = tiled_rows(NK, NV, 1) if tiled else np.arange(NV)
    qk = 2 * NK * DK
    exp = {"token_embd.weight": hf["model.embed_tokens.weight"],
           "output_norm.weight": hf["model.norm.weight"] + 1,
           "output.weight": hf["lm_head.weight"]}
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        _expected_ffn_layer(hf, p, b, exp)
        if (i + 1) % 4 == 0:
            _expected_attention(hf, p, b, exp)
            continue
        la = p + "linear_attn."
        exp[b + "ssm_a"] = -np.exp(hf[la + "A_log"])[vheads]
        exp[b + "ssm_dt.bias"] = hf[la + "dt_bias"][vheads]
        conv = hf[la + "conv1d.weight"][:, 0, :]
        exp[b + "ssm_conv1d.weight"] = np.concatenate([conv[:qk], conv[qk:][vrows]])
        exp[b + "ssm_norm.weight"] = hf[la + "norm.weight"]
        exp[b + "ssm_out.weight"] = hf[la + "out_proj.weight"][:, vrows]
        if tiled:
            w = hf[la + "in_proj_qkv.weight"]
            exp[b + "attn_qkv.weight"] = np.concatenate([w[:qk], w[qk:][vrows]])
            exp[b + "attn_gate.weight"] = hf[la + "in_proj_z.weight"][vrows]
            exp[b + "ssm_alpha.weight"] = hf[la + "in_proj_a.weight"][vheads]
            exp[b + "ssm_beta.weight"] = hf[la + "in_proj_b.weight"][vheads]
        else:
            w = hf[la + "in_proj_qkvz.weight"]
            r = NV // NK
            per = 2 * DK + 2 * r * DV
            blocks = [w[k * per:(k + 1) * per] for k in range(NK)]
            q = [blk[:DK] for blk in blocks]
            kk = [blk[DK:2 * DK] for blk in blocks]
            v = [blk[2 * DK:2 * DK + r * DV] for blk in blocks]
            z = [blk[2 * DK + r * DV:] for blk in blocks]
            exp[b + "attn_qkv.weight"] = np.concatenate(q + kk + v)
            exp[b + "attn_gate.weight"] = np.concatenate(z)
            exp[b + "ssm_ba.weight"] = hf[la + "in_proj_ba.weight"]
    return exp


def _expected_ffn_layer(hf: dict, p: str, b: str, exp: dict) -> None:
    exp[b + "attn_norm.weight"] = hf[p + "input_layernorm.weight"] + 1
    exp[b + "post_attention_norm.weight"] = hf[p + "post_attention_layernorm.weight"] + 1
    if p + "mlp.gate_proj.weight" in hf:       # the dense FFN
        for proj in ("gate", "up", "down"):
            exp[b + f"ffn_{proj}.weight"] = hf[p + f"mlp.{proj}_proj.weight"]
        return
    for proj in ("gate", "up", "down"):
        exp[b + f"ffn_{proj}_exps.weight"] = np.stack(
            [hf[p + f"mlp.experts.{e}.{proj}_proj.weight"] for e in range(EXPERTS)])
        exp[b + f"ffn_{proj}_shexp.weight"] = hf[p + f"mlp.shared_expert.{proj}_proj.weight"]
    exp[b + "ffn_gate_inp.weight"] = hf[p + "mlp.gate.weight"]
    exp[b + "ffn_gate_inp_shexp.weight"] = hf[p + "mlp.shared_expert_gate.weight"]


def _expected_attention(hf: dict, p: str, b: str, exp: dict) -> None:
    for n, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                 ("o_proj", "attn_output")):
        exp[b + g + ".weight"] = hf[p + f"self_attn.{n}.weight"]
    exp[b + "attn_q_norm.weight"] = hf[p + "self_attn.q_norm.weight"] + 1
    exp[b + "attn_k_norm.weight"] = hf[p + "self_attn.k_norm.weight"] + 1


def expected_mtp(mtp: dict) -> dict[str, np.ndarray]:
    """The GGUF block blk.{LAYERS} from a checkpoint's mtp.* tensors, as CONTRACT.md names them."""
    b = f"blk.{LAYERS}."
    exp = {b + "nextn.eh_proj.weight": mtp["mtp.fc.weight"],
           b + "nextn.enorm.weight": mtp["mtp.pre_fc_norm_embedding.weight"] + 1,
           b + "nextn.hnorm.weight": mtp["mtp.pre_fc_norm_hidden.weight"] + 1,
           b + "nextn.shared_head_norm.weight": mtp["mtp.norm.weight"] + 1}
    _expected_ffn_layer(mtp, "mtp.layers.0.", b, exp)
    _expected_attention(mtp, "mtp.layers.0.", b, exp)
    return exp


def add_mtp(d: Path, seed: int = 1) -> dict[str, np.ndarray]:
    """Give checkpoint `d` an MTP block as Qwen3.5/3.6 checkpoints carry it: random mtp.* tensors
    shaped as its last (full-attention) layer's, the eh_proj and three norms, and
    `mtp_num_hidden_layers: 1` in config.json. Returns the mtp.* tensors."""
    from safetensors.numpy import load_file, save_file
    state = load_file(d / "model.safetensors")
    rng = np.random.default_rng(seed)
    full = f"model.layers.{LAYERS - 1}."
    hidden = state["model.embed_tokens.weight"].shape[1]
    shapes = {"mtp.layers.0." + n[len(full):]: a.shape for n, a in state.items() if n.startswith(full)}
    shapes |= {"mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
               "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,)}
    mtp = {n: rng.normal(0.0, 0.5, shape).astype(np.float32) for n, shape in shapes.items()}
    save_file({**state, **mtp}, d / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}))
    return mtp


@pytest.fixture(scope="module")
def converted_mtp(tmp_path_factory):
    """kind -> (HF state dict with mtp.*, checkpoint dir, f32 GGUFModel)."""
    out = {}
    for kind in KINDS:
        root = tmp_path_factory.mktemp(kind + "-mtp")
        hf = build_checkpoint(kind, root / "hf")
        hf |= add_mtp(root / "hf")
        convert(root / "hf", root / "f32.gguf", "f32", progress=False)
        out[kind] = (hf, root / "hf", GGUFModel(root / "f32.gguf"))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_f32_tensors_map_back_to_hf(converted, kind):
    hf, _, model = converted[kind]
    expected = expected_tensors(kind, hf)
    assert set(model.tensors) == set(expected)
    for name, want in expected.items():
        got = model.tensor(name).dequant()
        assert got.shape == want.shape, name
        tol = SSM_A_ULPS * np.abs(want).max() if name.endswith("ssm_a") else 0.0
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_config_values(converted, kind):
    _, _, model = converted[kind]
    cfg = model.config
    assert cfg.arch == {"qwen3_5_moe_text": "qwen35moe", "qwen3_next": "qwen3next", "qwen3_5_text": "qwen35"}[kind]
    assert (cfg.n_layers, cfg.hidden_size, cfg.vocab_size) == (LAYERS, HIDDEN, 300)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dim) == (4, 2, 16, 4)
    assert (cfg.n_k_heads, cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim) == (NK, NV, DK, DV)
    if kind == "qwen3_5_text":                # llama.cpp's dense keys: feed_forward_length, no expert_*
        assert (cfg.ffn_kind, cfg.dense_ffn, cfg.n_experts) == ("dense", 96, 0)
        assert model.get("qwen35.feed_forward_length") == 96
        assert not any(k.startswith("qwen35.expert") for k in model.fields)
    else:
        assert (cfg.ffn_kind, cfg.dense_ffn) == ("moe", 0)
        assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn, cfg.shared_ffn) == (8, 2, 32, 32)
    assert cfg.full_layers == [3] and cfg.conv_kernel == 4 and cfg.rms_eps == pytest.approx(1e-6)
    a = cfg.arch
    assert model.get(f"{a}.attention.recurrent_layers") == [True, True, True, False]
    if a in ("qwen35moe", "qwen35"):
        assert model.get(f"{a}.rope.dimension_sections") == [11, 11, 10, 0]
        assert model.get("tokenizer.ggml.pre") == "qwen35"
    else:
        assert model.get("qwen3next.feed_forward_length") == 64
        assert model.get("tokenizer.ggml.pre") == "qwen2"


def test_tokenizer_fields(converted):
    _, src, model = converted["qwen3_5_moe_text"]
    vocab = json.loads((src / "tokenizer.json").read_text())
    tokens, types = model.get("tokenizer.ggml.tokens"), model.get("tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 300
    ids = {t: i for i, t in enumerate(tokens)}
    assert types[ids["<|im_end|>"]] == 3 and types[ids["<think>"]] == 4
    assert types[ids["the"]] == 1 and tokens[299] == "[PAD299]" and types[299] == 5
    assert model.get("tokenizer.ggml.merges") == vocab["model"]["merges"] or \
        model.get("tokenizer.ggml.merges") == [" ".join(m) for m in vocab["model"]["merges"]]
    assert model.get("tokenizer.ggml.eos_token_id") == ids["<|im_end|>"]
    assert model.get("tokenizer.ggml.padding_token_id") == ids["<|endoftext|>"]
    assert model.get("tokenizer.chat_template").startswith("{% for m in messages %}")


def _rewrite(src: Path, dst: Path, rename, config_fn=None, extra: dict | None = None,
             shards: int = 1) -> None:
    """Copy a checkpoint with tensors renamed/reshaped by `rename(name, array) -> {name: array}`."""
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    tensors = safetensors_torch.load_file(src / "model.safetensors")
    out: dict = {}
    for name, t in tensors.items():
        out.update(rename(name, t))
    out.update(extra or {})
    names = sorted(out)
    if shards == 1:
        safetensors_torch.save_file(out, dst / "model.safetensors")
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: out[n].contiguous() for n in names[s::shards]}
            safetensors_torch.save_file(part, dst / fname)
            weight_map.update({n: fname for n in part})
        (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if config_fn:
        cfg = json.loads((src / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config_fn(cfg)))


def _assert_same_file(a: Path, b: Path) -> None:
    ma, mb = GGUFModel(a), GGUFModel(b)
    assert set(ma.tensors) == set(mb.tensors)
    for name, t in ma.tensors.items():
        assert t.qtype == mb.tensors[name].qtype and t.shape == mb.tensors[name].shape, name
        assert np.array_equal(t.raw, mb.tensors[name].raw), name


@pytest.mark.parametrize("kind", KINDS)
def test_the_mtp_block_converts_as_llama_cpp_names_it(converted_mtp, kind):
    hf, _, model = converted_mtp[kind]
    expected = expected_tensors(kind, hf) | expected_mtp(hf)
    assert set(model.tensors) == set(expected)
    for name, want in expected.items():
        tol = SSM_A_ULPS * np.abs(want).max() if name.endswith("ssm_a") else 0.0
        np.testing.assert_allclose(model.tensor(name).dequant(), want, rtol=0, atol=tol, err_msg=name)
    cfg, a = model.config, model.config.arch
    assert (cfg.n_layers, cfg.n_nextn_layers) == (LAYERS, 1)
    assert model.get(f"{a}.block_count") == LAYERS + 1 and model.get(f"{a}.nextn_predict_layers") == 1
    assert model.get(f"{a}.attention.recurrent_layers") == [True, True, True, False, False]
    bound = bind(model)
    assert bound.mtp["eh_proj"] is model.tensor(f"blk.{LAYERS}.nextn.eh_proj.weight")
    assert bound.mtp["embed_tokens"] is None and bound.mtp["shared_head_head"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_the_converted_mtp_block_drafts(converted_mtp, kind):
    from common.reference.model import ReferenceModel
    _, _, model = converted_mtp[kind]
    ref = ReferenceModel(model)
    state = ref.new_state()
    ref.prefill([5, 6, 7], state)
    _, hidden = ref.verify([[8, 9]], [state], [ref.new_rollback(1)])
    logits, h_out = ref.draft([[9, 10]], hidden, [ref.new_draft_state()])
    assert logits.shape == (2, 300) and np.isfinite(logits).all() and np.isfinite(h_out).all()


def test_no_mtp_leaves_the_block_out(converted, converted_mtp, tmp_path):
    _, plain_src, _ = converted["qwen3_5_moe_text"]
    _, src, _ = converted_mtp["qwen3_5_moe_text"]
    convert(plain_src, tmp_path / "plain.gguf", "f32", progress=False)
    convert(src, tmp_path / "no-mtp.gguf", "f32", progress=False, mtp=False)
    _assert_same_file(tmp_path / "plain.gguf", tmp_path / "no-mtp.gguf")
    model = GGUFModel(tmp_path / "no-mtp.gguf")
    assert model.get("qwen35moe.block_count") == LAYERS and not model.has("qwen35moe.nextn_predict_layers")
    proc = subprocess.run([sys.executable, "-m", "fermium", "convert", str(src), str(tmp_path / "cli.gguf"),
                           "--type", "f32", "--no-mtp", "-q"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _assert_same_file(tmp_path / "plain.gguf", tmp_path / "cli.gguf")


def test_the_mtp_layer_is_typed_as_a_full_attention_layer(tmp_path):
    build_checkpoint("qwen3_5_moe_text", tmp_path / "hf", hidden=256, ffn=256, experts=4, tokenizer=False)
    add_mtp(tmp_path / "hf")
    q = GGUFModel(convert(tmp_path / "hf", tmp_path / "q.gguf", "q4_k_m", progress=False).path)
    full, mtp = f"blk.{LAYERS - 1}.", f"blk.{LAYERS}."
    shared = [n[len(mtp):] for n in q.tensors if n.startswith(mtp) and ".nextn." not in n]
    assert len(shared) == 16
    for suffix in shared:
        assert q.tensors[mtp + suffix].qtype == q.tensors[full + suffix].qtype, suffix
    assert q.tensors[mtp + "nextn.eh_proj.weight"].qtype.name == "Q4_K"
    assert q.tensors[mtp + "nextn.enorm.weight"].qtype.name == "F32"


def test_an_incomplete_mtp_block_is_named(converted, tmp_path):
    _, src, _ = converted["qwen3_5_moe_text"]
    extra = {"mtp.fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN),
             "mtp.layers.0.input_layernorm.weight": torch.zeros(HIDDEN)}
    _rewrite(src, tmp_path / "part", lambda name, t: {name: t}, extra=extra)
    with pytest.raises(ConvertError, match=r"the MTP block \(mtp\.\*\) is incomplete, it lacks "
                                           r"blk\.4\.nextn\.enorm\.weight \(mtp\.pre_fc_norm_embedding\.weight\)"):
        convert(tmp_path / "part", tmp_path / "m.gguf", "f32", progress=False)
    assert list(tmp_path.glob("m.gguf*")) == []
    only_head = {"mtp.fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}
    _rewrite(src, tmp_path / "head", lambda name, t: {name: t}, extra=only_head)
    with pytest.raises(ConvertError, match="without an mtp.layers.0 block"):
        convert(tmp_path / "head", tmp_path / "m.gguf", "f32", progress=False)


def test_wrapper_checkpoint_converts_the_same(converted, tmp_path):
    _, src, _ = converted["qwen3_5_moe_text"]

    def wrap(name, t):
        return {name.replace("model.", "model.language_model.", 1) if name.startswith("model.")
                else name: t}

    def wrap_config(cfg):
        return {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "text_config": cfg, "vision_config": {"depth": 1}}

    # an MTP block (model.mtp.* as some checkpoints name it), left out by mtp=False; the vision tower is never read
    extra = {"model.mtp.fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN),
             "mtp.layers.0.input_layernorm.weight": torch.zeros(HIDDEN),
             "model.visual.patch_embed.proj.weight": torch.zeros(8, 3)}
    _rewrite(src, tmp_path / "wrapped", wrap, wrap_config, extra)
    convert(src, tmp_path / "plain.gguf", "f32", progress=False)
    convert(tmp_path / "wrapped", tmp_path / "wrapped.gguf", "f32", progress=False, mtp=False)
    _assert_same_file(tmp_path / "plain.gguf", tmp_path / "wrapped.gguf")


def test_fused_experts_and_shards_convert_the_same(converted, tmp_path):
    _, src, _ = converted["qwen3_5_moe_text"]
    state = safetensors_torch.load_file(src / "model.safetensors")

    def fuse(name, t):
        if ".mlp.experts." not in name:
            return {name: t}
        if not name.endswith("experts.0.gate_proj.weight"):
            return {}
        p = name.split("mlp.experts.")[0] + "mlp.experts."
        stack = lambda proj: torch.stack(  # noqa: E731
            [state[f"{p}{e}.{proj}_proj.weight"] for e in range(EXPERTS)])
        return {p + "gate_up_proj": torch.cat([stack("gate"), stack("up")], dim=1),
                p + "down_proj": stack("down")}

    _rewrite(src, tmp_path / "fused", fuse, shards=3)
    assert len(list((tmp_path / "fused").glob("*.safetensors"))) == 3
    convert(src, tmp_path / "plain.gguf", "f32", progress=False)
    convert(tmp_path / "fused", tmp_path / "fused.gguf", "f32", progress=False)
    _assert_same_file(tmp_path / "plain.gguf", tmp_path / "fused.gguf")


def _rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


@pytest.mark.parametrize("out_type,tol", [("q8_0", Q8_0_REL_RMS), ("q4_0", Q4_0_REL_RMS)])
def test_quantized_files_dequantize_close(converted, tmp_path, out_type, tol):
    _, src, f32 = converted["qwen3_5_moe_text"]
    convert(src, tmp_path / "q.gguf", out_type, progress=False)
    q = GGUFModel(tmp_path / "q.gguf")
    assert q.config == f32.config
    for name, t in f32.tensors.items():
        assert _rel_rms(q.tensor(name).dequant(), t.dequant()) < tol, name


def test_q4_k_m_mix(tmp_path):
    """hidden 256 so that the K-quants (256-value super-blocks) are really used."""
    build_checkpoint("qwen3_5_moe_text", tmp_path / "hf", hidden=256, ffn=256, experts=4,
                     tokenizer=False)
    convert(tmp_path / "hf", tmp_path / "f32.gguf", "f32", progress=False)
    result = convert(tmp_path / "hf", tmp_path / "q.gguf", "q4_k_m", progress=False)
    assert {"Q4_K", "Q5_K", "Q6_K", "F32"} <= set(result.types)
    f32, q = GGUFModel(tmp_path / "f32.gguf"), GGUFModel(tmp_path / "q.gguf")
    kind = {n: t.qtype.name for n, t in q.tensors.items()}
    assert kind["output.weight"] == "Q6_K" and kind["blk.0.attn_qkv.weight"] == "Q5_K"
    # of 4 layers llama.cpp's use_more_bits picks 2 and 3
    assert kind["blk.0.ffn_down_exps.weight"] == kind["blk.0.ffn_down_shexp.weight"] == "Q4_K"
    assert kind["blk.2.ffn_down_exps.weight"] == kind["blk.3.attn_v.weight"] == "Q6_K"
    assert kind["blk.0.ffn_gate_inp.weight"] == kind["blk.0.ssm_alpha.weight"] == "F32"
    assert kind["blk.0.ssm_out.weight"] == "Q8_0"             # rows of 64 (nv*dv): not 256
    for name, t in f32.tensors.items():
        assert _rel_rms(q.tensor(name).dequant(), t.dequant()) < Q4_K_M_REL_RMS, name


def test_checkpoint_without_tokenizer_converts(tmp_path, caplog):
    build_checkpoint("qwen3_next", tmp_path / "hf", tokenizer=False)
    result = convert(tmp_path / "hf", tmp_path / "m.gguf", "f16", progress=False)
    assert not result.has_tokenizer and "no tokenizer.json" in caplog.text
    assert not GGUFModel(tmp_path / "m.gguf").has("tokenizer.ggml.tokens")


# ---- bad input: a ConvertError naming the file, exit code 2, and no output left behind

@pytest.fixture
def bad_src(converted, tmp_path):
    _, src, _ = converted["qwen3_next"]
    dst = tmp_path / "src"
    shutil.copytree(src, dst)
    return dst


def _break_model_type(d: Path):
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    return "model_type 'llama' is not supported"


def _break_missing_shard(d: Path):
    names = list(read_header(d / "model.safetensors"))
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    index = {"weight_map": {n: f"model-0000{1 + i % 2}-of-00002.safetensors"
                            for i, n in enumerate(names)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return "missing shard"


def _break_truncate(d: Path):
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    return "truncated safetensors file"


def _break_header(d: Path):
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    return "truncated safetensors file"


def _break_config(d: Path):
    (d / "config.json").unlink()
    return "no config.json"


BREAKERS = [_break_model_type, _break_missing_shard, _break_truncate, _break_header, _break_config]


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__[7:])
def test_bad_input_raises_and_leaves_nothing(bad_src, tmp_path, breaker):
    message = breaker(bad_src)
    out_dir = tmp_path / "out"
    with pytest.raises(ConvertError, match=message):
        convert(bad_src, out_dir / "m.gguf", "f32", progress=False)
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_unsupported_type_is_an_error(bad_src, tmp_path):
    with pytest.raises(ConvertError, match="unsupported value 'q3_k'"):
        convert(bad_src, tmp_path / "m.gguf", "q3_k", progress=False)
    assert list(tmp_path.glob("m.gguf*")) == []


def test_failure_midway_removes_the_partial_file(bad_src, tmp_path, monkeypatch):
    from common.model.convert import writer

    def boom(data, qtype):
        raise RuntimeError("disk full")

    monkeypatch.setattr(writer, "quantize", boom)
    with pytest.raises(RuntimeError):
        convert(bad_src, tmp_path / "m.gguf", "f32", progress=False)
    assert list(tmp_path.glob("m.gguf*")) == []


def test_cli_exit_code_and_message(bad_src, tmp_path):
    _break_truncate(bad_src)
    out = tmp_path / "m.gguf"
    proc = subprocess.run([sys.executable, "-m", "fermium", "convert", str(bad_src), str(out),
                           "--type", "q8_0", "-q"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "truncated safetensors file" in proc.stderr and str(bad_src) in proc.stderr
    assert list(tmp_path.glob("m.gguf*")) == []


def test_missing_config_key_is_named(bad_src, tmp_path):
    cfg = json.loads((bad_src / "config.json").read_text())
    del cfg["linear_num_value_heads"]
    (bad_src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="missing 'linear_num_value_heads'"):
        convert(bad_src, tmp_path / "m.gguf", "f32", progress=False)


def test_rope_metadata_from_either_config_style(tmp_path):
    from common.model.convert.arch import QWEN35MOE, metadata
    hf_cfg = json.loads(transformers.Qwen3_5MoeTextConfig().to_json_string())
    new_style = dict(hf_cfg, rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                              "mrope_section": [11, 11, 10]})
    old_style = {k: v for k, v in hf_cfg.items() if k != "rope_parameters"}
    old_style.update(rope_theta=1e7, partial_rotary_factor=0.25)
    for cfg in (new_style, old_style):
        kv = {k: v for k, v, *_ in metadata(QWEN35MOE, cfg, tmp_path, 15)}
        assert kv["qwen35moe.rope.freq_base"] == 1e7
        assert kv["qwen35moe.rope.dimension_count"] == 64          # 256 * 0.25
        assert kv["qwen35moe.rope.dimension_sections"] == [11, 11, 10, 0]
        assert kv["qwen35moe.block_count"] == 40 and kv["qwen35moe.expert_count"] == 256
        assert kv["qwen35moe.ssm.inner_size"] == 4096 and kv["general.file_type"] == 15
