"""Tiny random GGUF models of the real architectures, written with gguf alone (no torch), so the
GPU machine can build them. Weights are random with a chosen standard deviation; the tensors of
the types gguf cannot quantize (K-quants, i-quants) are random blocks whose scales are set to
give that deviation."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

# f16 scale fields of each block type: (offset of d, offset of the min's scale or None, min / d
# giving a zero mean); IQ1_M's d is spread over its scale words (set_scales). MXFP4 has none.
BLOCK_SCALES = {Q.Q8_0: (0, None, 0.0), Q.Q4_0: (0, None, 0.0), Q.Q4_1: (0, 2, -7.5), Q.Q5_0: (0, None, 0.0),
                Q.Q5_1: (0, 2, -15.5), Q.TQ1_0: (52, None, 0.0), Q.TQ2_0: (64, None, 0.0),
                Q.Q4_K: (0, 2, 7.5), Q.Q5_K: (0, 2, 15.5), Q.Q6_K: (208, None, 0.0),
                Q.Q2_K: (80, 82, 1.5), Q.Q3_K: (108, None, 0.0), Q.IQ1_M: (None, None, 0.0),
                **{q: (0, None, 0.0) for q in (Q.IQ4_NL, Q.IQ4_XS, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S,
                                                Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S)}}
# the types gguf cannot quantize: weight() draws them as random blocks with their scales set
RANDOM_BLOCKS = {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.IQ2_XXS, Q.IQ2_XS,
                 Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M}


@dataclass(frozen=True)
class TinySpec:
    arch: str = "qwen35moe"
    hidden: int = 256
    layers: int = 4
    vocab: int = 512
    n_heads: int = 4
    n_kv: int = 2
    head_dim: int = 64
    rope_dim: int = 16
    nk: int = 2
    nv: int = 4
    dk: int = 64
    dv: int = 64
    experts: int = 8
    top_k: int = 2
    ffn: int = 256
    shared_ffn: int = 256
    # role -> type
    types: dict = field(default_factory=lambda: {
        "experts": Q.Q4_K, "down": Q.Q6_K, "attn": Q.Q8_0, "linear": Q.Q5_K, "shared": Q.Q4_0,
        "router": Q.F32, "embd": Q.F16, "head": Q.Q6_K, "small": Q.BF16})
    # per-layer overrides of `types`, layer i taking entry i % len (files mix types by layer too);
    # an "up" entry gives the experts' up tensors a type of their own (unfused gate and up)
    layer_types: tuple = ()


# two mixes that hold every type of the CUDA prefill's second set of kernels between them, each
# varying by layer (over the older types too), as the importance-matrix quants of the 35B do
MIX_IQ = TinySpec(types={"experts": Q.IQ2_XXS, "down": Q.Q3_K, "attn": Q.IQ4_XS, "linear": Q.Q2_K,
                         "shared": Q.IQ3_S, "router": Q.F32, "embd": Q.Q5_0, "head": Q.IQ4_NL, "small": Q.Q5_1},
                  layer_types=({}, {"experts": Q.IQ3_XXS, "up": Q.IQ4_NL, "down": Q.IQ2_S, "linear": Q.IQ2_XS,
                                    "shared": Q.Q4_1}))
MIX_LOW = TinySpec(arch="qwen3next",
                   types={"experts": Q.MXFP4, "down": Q.IQ1_M, "attn": Q.TQ2_0, "linear": Q.IQ1_S,
                          "shared": Q.TQ1_0, "router": Q.F16, "embd": Q.Q4_1, "head": Q.Q5_1, "small": Q.Q5_0},
                   layer_types=({}, {"experts": Q.Q4_K, "down": Q.Q6_K}, {"linear": Q.Q8_0}))


def set_scales(raw: np.ndarray, qtype: Q, d, dmin=None) -> None:
    """Write the f16 scale d (and the min's, dmin) into every block of raw [blocks, bytes]: scalars
    or one per block. IQ1_M keeps its d as the top nibbles of its four scale words (bytes 48-55)."""
    d_off, m_off, _ = BLOCK_SCALES[qtype]

    def f16(v) -> np.ndarray:
        return np.broadcast_to(np.asarray(v, np.float32).reshape(-1, 1), (len(raw), 1)).astype(np.float16)
    if qtype == Q.IQ1_M:
        bits = f16(d).view(np.uint16)
        words = raw[:, 48:56].copy().view(np.uint16)                     # [blocks, 4]
        nib = (bits >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(15)
        raw[:, 48:56] = ((words & np.uint16(0x0fff)) | (nib << np.uint16(12))).view(np.uint8)
        return
    raw[:, d_off:d_off + 2] = f16(d).view(np.uint8)
    if m_off is not None and dmin is not None:
        raw[:, m_off:m_off + 2] = f16(dmin).view(np.uint8)


def random_blocks(qtype: Q, n_blocks: int, rng, lo: float = 1e-3, hi: float = 0.1) -> np.ndarray:
    """[n_blocks, block bytes] of random bytes whose scales (d and any min's, or MXFP4's
    exponent 2^(e-128)) are drawn from [lo, hi), so that every value is finite."""
    raw = rng.integers(0, 256, size=(n_blocks, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    s = rng.uniform(lo, hi, size=(n_blocks, 2))
    if qtype == Q.MXFP4:
        raw[:, 0] = np.floor(np.log2(s[:, 0])).astype(np.int64) + 128
    else:
        set_scales(raw, qtype, s[:, 0], s[:, 1])
    return raw


def _kquant(qtype: Q, shape: tuple[int, ...], std: float, rng) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    raw = random_blocks(qtype, rows * shape[-1] // block, rng)
    ratio = BLOCK_SCALES[qtype][2]
    set_scales(raw, qtype, 1e-3, 1e-3 * ratio)
    got = dequantize(raw, qtype).std()
    d = 1e-3 * std / got
    set_scales(raw, qtype, d, d * ratio)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def weight(qtype: Q, shape: tuple[int, ...], std: float, rng) -> tuple[np.ndarray, Q | None]:
    """(array for GGUFWriter.add_tensor, raw_dtype)"""
    if qtype in RANDOM_BLOCKS:
        return _kquant(qtype, shape, std, rng), qtype
    x = (rng.standard_normal(shape) * std).astype(np.float32)
    if qtype == Q.F32:
        return x, None
    if qtype == Q.F16:
        return x.astype(np.float16), None
    return quantize(x, qtype), qtype


def build(path: Path, spec: TinySpec = TinySpec(), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    s, ty = spec, spec.types
    H = s.hidden
    w = gguf.GGUFWriter(str(path), s.arch)
    a = s.arch
    for key, val in {"embedding_length": H, "block_count": s.layers, "context_length": 8192,
                     "attention.head_count": s.n_heads, "attention.head_count_kv": s.n_kv,
                     "attention.key_length": s.head_dim, "attention.value_length": s.head_dim,
                     "rope.dimension_count": s.rope_dim, "full_attention_interval": 4,
                     "ssm.conv_kernel": 4, "ssm.group_count": s.nk, "ssm.state_size": s.dk,
                     "ssm.time_step_rank": s.nv, "ssm.inner_size": s.nv * s.dv,
                     "expert_count": s.experts, "expert_used_count": s.top_k,
                     "expert_feed_forward_length": s.ffn,
                     "expert_shared_feed_forward_length": s.shared_ffn}.items():
        w.add_uint32(f"{a}.{key}", val)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1e7)

    def add(name: str, qtype: Q, shape: tuple[int, ...], std: float):
        data, raw = weight(qtype, shape, std, rng)
        w.add_tensor(name, data, raw_dtype=raw)

    def norm(name: str, n: int, centred: bool = True):
        v = (1.0 if centred else 0.0) + rng.standard_normal(n).astype(np.float32) * 0.2
        w.add_tensor(name, v.astype(np.float32))

    inv = 1.0 / np.sqrt(H)
    add("token_embd.weight", ty["embd"], (s.vocab, H), 1.0)
    norm("output_norm.weight", H)
    add("output.weight", ty["head"], (s.vocab, H), inv)
    C = 2 * s.nk * s.dk + s.nv * s.dv
    for i in range(s.layers):
        p = f"blk.{i}."
        ty = {**s.types, **(s.layer_types[i % len(s.layer_types)] if s.layer_types else {})}
        norm(p + "attn_norm.weight", H)
        norm(p + "post_attention_norm.weight", H)
        if (i + 1) % 4 == 0:
            add(p + "attn_q.weight", ty["attn"], (s.n_heads * 2 * s.head_dim, H), inv)
            add(p + "attn_k.weight", ty["attn"], (s.n_kv * s.head_dim, H), inv)
            add(p + "attn_v.weight", ty["attn"], (s.n_kv * s.head_dim, H), inv)
            add(p + "attn_output.weight", ty["attn"], (H, s.n_heads * s.head_dim), 1 / np.sqrt(s.n_heads * s.head_dim))
            norm(p + "attn_q_norm.weight", s.head_dim)
            norm(p + "attn_k_norm.weight", s.head_dim)
        else:
            add(p + "attn_qkv.weight", ty["linear"], (C, H), inv)
            add(p + "attn_gate.weight", ty["linear"], (s.nv * s.dv, H), inv)
            if s.arch == "qwen3next":
                add(p + "ssm_ba.weight", ty["small"], (2 * s.nv, H), inv)
            else:
                add(p + "ssm_beta.weight", ty["small"], (s.nv, H), inv)
                add(p + "ssm_alpha.weight", ty["small"], (s.nv, H), inv)
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((C, 4)) * 0.5).astype(np.float32))
            w.add_tensor(p + "ssm_a", -np.exp(rng.standard_normal(s.nv) * 0.5).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", (rng.standard_normal(s.nv) * 0.5).astype(np.float32))
            norm(p + "ssm_norm.weight", s.dv, centred=True)
            add(p + "ssm_out.weight", ty["linear"], (H, s.nv * s.dv), 1 / np.sqrt(s.nv * s.dv))
        add(p + "ffn_gate_inp.weight", ty["router"], (s.experts, H), 1.0)
        add(p + "ffn_gate_exps.weight", ty["experts"], (s.experts, s.ffn, H), inv)
        add(p + "ffn_up_exps.weight", ty.get("up", ty["experts"]), (s.experts, s.ffn, H), inv)
        add(p + "ffn_down_exps.weight", ty["down"], (s.experts, H, s.ffn), 1 / np.sqrt(s.ffn))
        add(p + "ffn_gate_shexp.weight", ty["shared"], (s.shared_ffn, H), inv)
        add(p + "ffn_up_shexp.weight", ty["shared"], (s.shared_ffn, H), inv)
        add(p + "ffn_down_shexp.weight", ty["shared"], (H, s.shared_ffn), 1 / np.sqrt(s.shared_ffn))
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(H) * inv).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def open_model(path: Path):
    """The GGUFModel of a tiny file."""
    from common.model.gguf_file import GGUFModel
    return GGUFModel(path)
