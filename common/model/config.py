"""Model configuration, read once from GGUF metadata.

Three architectures share one definition: `qwen35moe` (Qwen3.5/3.6 MoE), `qwen35` (Qwen3.5's
dense models) and `qwen3next`. They differ in three ways, all flags here, read from the
architecture name:
- the Gated DeltaNet value heads: llama.cpp tiles them for qwen35moe and qwen35 (value head p
  reads key head p % n_k_heads) and keeps them grouped for qwen3next (p // (n_v / n_k));
- beta and alpha: qwen35moe and qwen35 store `ssm_beta` and `ssm_alpha`, qwen3next one fused `ssm_ba`;
- the FFN: routed experts and a shared expert ("moe"), or one SwiGLU of `feed_forward_length`
  ("dense", qwen35), in every trunk layer and in the MTP block.
The tensors each layer kind carries are listed in common/model/layers.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.errors import UserError


class ModelConfigError(UserError, ValueError):
    """A model file that Fermium cannot serve, with the reason in words."""


@dataclass(frozen=True)
class ArchTraits:
    v_head_layout: str           # how a value head finds its key head in the file's order
    fused_ba: bool               # one ssm_ba matrix: per key head, r beta rows then r alpha rows
    ffn_kind: str = "moe"        # "moe" | "dense": the FFN of every layer (layers.FFN_SPECS)


ARCHITECTURES: dict[str, ArchTraits] = {
    "qwen35moe": ArchTraits(v_head_layout="tiled", fused_ba=False),
    "qwen35": ArchTraits(v_head_layout="tiled", fused_ba=False, ffn_kind="dense"),
    "qwen3next": ArchTraits(v_head_layout="grouped", fused_ba=True),
}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    n_layers: int                # trunk layers (block_count - nextn_predict_layers)
    n_nextn_layers: int          # MTP blocks stored after the trunk (the draft step runs the first)
    context_length: int
    rms_eps: float
    # gated full attention
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_dim: int                # rotary dims at the front of each head (NeoX rotate-half)
    rope_theta: float
    full_attention_interval: int
    # Gated DeltaNet
    conv_kernel: int
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    v_head_layout: str           # "tiled" | "grouped"
    # MoE (all 0 in a dense model)
    n_experts: int
    n_experts_used: int
    expert_ffn: int
    shared_ffn: int              # 0: no shared expert
    fused_ba: bool = False       # see ArchTraits
    ffn_kind: str = "moe"        # see ArchTraits
    dense_ffn: int = 0           # the dense FFN's width (feed_forward_length); 0 in an MoE model
    # mRoPE: how many of the rope_dim / 2 frequencies follow T, H and W (interleaved); () = none
    rope_sections: tuple[int, ...] = ()

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def linear_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if not self.is_full_attention(i)]

    @property
    def full_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_full_attention(i)]

    @property
    def has_mtp(self) -> bool:
        """The metadata declares an MTP block (whether the file carries it, bind() says)."""
        return self.n_nextn_layers > 0

    @property
    def has_shared_expert(self) -> bool:
        return self.shared_ffn > 0

    @property
    def conv_channels(self) -> int:
        # q, k and v all pass through the causal conv1d
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim

    def key_head_of(self, v_head: int) -> int:
        if self.v_head_layout == "tiled":
            return v_head % self.n_k_heads
        return v_head // (self.n_v_heads // self.n_k_heads)

    @classmethod
    def from_gguf_fields(cls, get: Callable[[str], Any], has: Callable[[str], bool],
                         path: str | Path, vocab_size: int) -> "ModelConfig":
        """Build from GGUF key/value accessors. `get(key)` returns a field's value."""
        arch = get("general.architecture") if has("general.architecture") else None
        if arch not in ARCHITECTURES:
            raise ModelConfigError(
                f"{path}: general.architecture is {arch!r}; Fermium supports "
                f"{', '.join(sorted(ARCHITECTURES))}")

        def key(name: str, default: Any = None) -> Any:
            full = f"{arch}.{name}"
            if has(full):
                return get(full)
            if default is not None:
                return default
            raise ModelConfigError(
                f"{path}: missing metadata key {full!r}, required for architecture {arch!r} "
                f"(supported: {', '.join(sorted(ARCHITECTURES))})")

        traits = ARCHITECTURES[arch]
        hidden = int(key("embedding_length"))
        n_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden // n_heads))
        blocks = int(key("block_count"))
        nextn = int(key("nextn_predict_layers", 0))
        n_v = int(key("ssm.time_step_rank"))
        inner = int(key("ssm.inner_size"))
        dense = traits.ffn_kind == "dense"
        moe_key = (lambda name, default=None: 0) if dense else key   # a dense model has no experts
        return cls(
            arch=arch,
            vocab_size=vocab_size,
            hidden_size=hidden,
            n_layers=blocks - nextn,
            n_nextn_layers=nextn,
            context_length=int(key("context_length")),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv")),
            head_dim=head_dim,
            rope_dim=int(key("rope.dimension_count", head_dim)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            full_attention_interval=int(key("full_attention_interval", 4)),
            conv_kernel=int(key("ssm.conv_kernel")),
            n_k_heads=int(key("ssm.group_count")),
            n_v_heads=n_v,
            head_k_dim=int(key("ssm.state_size")),
            head_v_dim=inner // n_v,
            v_head_layout=traits.v_head_layout,
            n_experts=int(moe_key("expert_count")),
            n_experts_used=int(moe_key("expert_used_count")),
            expert_ffn=int(moe_key("expert_feed_forward_length")),
            shared_ffn=int(moe_key("expert_shared_feed_forward_length", 0)),
            fused_ba=traits.fused_ba,
            ffn_kind=traits.ffn_kind,
            dense_ffn=int(key("feed_forward_length")) if dense else 0,
            rope_sections=tuple(int(s) for s in get(f"{arch}.rope.dimension_sections"))
            if has(f"{arch}.rope.dimension_sections") else (),
        )
