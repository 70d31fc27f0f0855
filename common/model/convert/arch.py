"""Architectures the converter knows, keyed by the checkpoint's `model_type`, and the
GGUF metadata each one gets (llama.cpp's keys for `qwen35moe`, `qwen35` and `qwen3next`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_VERSION
from gguf import GGUFValueType as V

from .errors import ConvertError

QWEN35_MROPE_SECTIONS = [11, 11, 10, 0]      # llama.cpp's default when the config has none


@dataclass(frozen=True)
class Arch:
    gguf_arch: str
    tokenizer_pre: str
    tiled_v_heads: bool          # reorder V heads from grouped-by-key-head to tiled
    mrope_sections: bool
    moe: bool = True             # experts: their metadata keys are required (a dense model has none)


QWEN35MOE = Arch("qwen35moe", "qwen35", tiled_v_heads=True, mrope_sections=True)
QWEN35 = Arch("qwen35", "qwen35", tiled_v_heads=True, mrope_sections=True, moe=False)
QWEN3NEXT = Arch("qwen3next", "qwen2", tiled_v_heads=False, mrope_sections=False)

ARCHITECTURES: dict[str, Arch] = {
    "qwen3_5_moe_text": QWEN35MOE,
    "qwen3_5_moe": QWEN35MOE,
    "qwen3_5_text": QWEN35,
    "qwen3_5": QWEN35,
    "qwen3_next": QWEN3NEXT,
}


def arch_for(config: dict, path: Path) -> Arch:
    model_type = config.get("model_type")
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise ConvertError(path / "config.json",
                           f"model_type {model_type!r} is not supported; supported: "
                           f"{', '.join(sorted(ARCHITECTURES))}") from None


def _require(hp: dict, key: str, path: Path) -> Any:
    if key not in hp:
        raise ConvertError(path / "config.json", f"missing {key!r} in the text model config")
    return hp[key]


def rope_parameters(hp: dict) -> dict:
    # transformers 5 keeps rope settings in rope_parameters; older configs at the top level
    rope = dict(hp.get("rope_scaling") or {})
    rope.update(hp.get("rope_parameters") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in rope and key in hp:
            rope[key] = hp[key]
    return rope


def metadata(arch: Arch, hp: dict, path: Path, file_type: int,
             n_mtp: int = 0) -> list[tuple[str, Any, V, V | None]]:
    """(key, value, type, array element type) in llama.cpp's order. `n_mtp` MTP blocks follow the
    trunk: block_count counts them, nextn_predict_layers says how many, and they are not recurrent."""
    a = arch.gguf_arch
    req = lambda k: _require(hp, k, path)  # noqa: E731
    n_layers = int(req("num_hidden_layers"))
    n_heads = int(req("num_attention_heads"))
    head_dim = int(hp.get("head_dim") or int(req("hidden_size")) // n_heads)
    rope = rope_parameters(hp)
    u32 = lambda k, v: (f"{a}.{k}", int(v), V.UINT32, None)  # noqa: E731
    out = [
        u32("block_count", n_layers + n_mtp),
        u32("context_length", req("max_position_embeddings")),
        u32("embedding_length", req("hidden_size")),
    ]
    if hp.get("intermediate_size") is not None or not arch.moe:
        out.append(u32("feed_forward_length", req("intermediate_size")))
    out += [u32("attention.head_count", n_heads),
            u32("attention.head_count_kv", req("num_key_value_heads"))]
    if "rope_theta" in rope:
        out.append((f"{a}.rope.freq_base", float(rope["rope_theta"]), V.FLOAT32, None))
    out.append((f"{a}.attention.layer_norm_rms_epsilon", float(req("rms_norm_eps")), V.FLOAT32, None))
    if arch.moe:
        out += [u32("expert_count", req("num_experts")), u32("expert_used_count", req("num_experts_per_tok"))]
    out += [
        u32("attention.key_length", head_dim),
        u32("attention.value_length", head_dim),
        ("general.file_type", int(file_type), V.UINT32, None),
    ]
    if arch.moe:
        out.append(u32("expert_feed_forward_length", req("moe_intermediate_size")))
    if hp.get("shared_expert_intermediate_size") is not None:
        out.append(u32("expert_shared_feed_forward_length", hp["shared_expert_intermediate_size"]))
    if n_mtp:
        out.append(u32("nextn_predict_layers", n_mtp))
    n_v = int(req("linear_num_value_heads"))
    out += [
        u32("ssm.conv_kernel", req("linear_conv_kernel_dim")),
        u32("ssm.state_size", req("linear_key_head_dim")),
        u32("ssm.group_count", req("linear_num_key_heads")),
        u32("ssm.time_step_rank", n_v),
        u32("ssm.inner_size", int(req("linear_value_head_dim")) * n_v),
    ]
    layer_types = hp.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != n_layers:
            raise ConvertError(path / "config.json", f"layer_types has {len(layer_types)} "
                                                     f"entries for {n_layers} layers")
        out.append((f"{a}.attention.recurrent_layers",
                    [t == "linear_attention" for t in layer_types] + [False] * n_mtp, V.ARRAY, V.BOOL))
    out += [
        u32("full_attention_interval", hp.get("full_attention_interval", 4)),
        u32("rope.dimension_count", int(head_dim * rope.get("partial_rotary_factor", 0.25))),
    ]
    sections = rope.get("mrope_section")
    if sections is not None or arch.mrope_sections:
        sections = list(sections or QWEN35_MROPE_SECTIONS)
        sections = (sections + [0, 0, 0, 0])[:4]
        out.append((f"{a}.rope.dimension_sections", [int(s) for s in sections], V.ARRAY, V.INT32))
    out.append(("general.quantization_version", GGML_QUANT_VERSION, V.UINT32, None))
    return out
