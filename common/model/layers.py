"""The layer specification: every tensor a model file may hold, by layer kind, with its role and
its shape as a function of ModelConfig; and `bind`, the one place that checks a file against it.

Kinds: the globals, the Gated DeltaNet mixer (`linear`), the gated full-attention mixer
(`full`), the FFN of every trunk layer (the MoE with its shared expert, or the dense SwiGLU:
FFN_SPECS by `ffn_kind`), and the MTP block that llama.cpp files carry after the trunk: the
`nextn` tensors plus a full-attention layer with the trunk's FFN, bound as `BoundModel.mtp` when
the file has it (whole, or not at all).

Architecture differences are ModelConfig flags (`fused_ba`, `v_head_layout`, `ffn_kind`), so
runners never tell the architectures apart by looking for a tensor. Roles are the runners' names for the
tensors (the CPU runner's `fm_layer` fields). Shapes are numpy order, (out, in).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig, ModelConfigError
from .gguf_file import Tensor

Shape = Callable[[ModelConfig], tuple[int, ...]]
MAX_LISTED = 12          # problems named in the error; the rest are counted


def _always(cfg: ModelConfig) -> bool:
    return True


@dataclass(frozen=True)
class TensorSpec:
    role: str
    suffix: str                  # the GGUF name after "blk.{i}." (globals: the whole name)
    shape: Shape
    optional: bool = False
    vector: bool = False         # small: runners dequantize it to float32 once
    when: Callable[[ModelConfig], bool] = _always   # whether this config has the tensor at all


def _H(c: ModelConfig) -> tuple[int, ...]:
    return (c.hidden_size,)


def _fused(c: ModelConfig) -> bool:
    return c.fused_ba


def _split(c: ModelConfig) -> bool:
    return not c.fused_ba


def _shared(c: ModelConfig) -> bool:
    return c.has_shared_expert


GLOBALS = (
    TensorSpec("embd", "token_embd.weight", lambda c: (c.vocab_size, c.hidden_size)),
    TensorSpec("out_norm", "output_norm.weight", _H, vector=True),
    TensorSpec("output", "output.weight", lambda c: (c.vocab_size, c.hidden_size), optional=True),
)

NORMS = (
    TensorSpec("attn_norm", "attn_norm.weight", _H, vector=True),
    TensorSpec("post_norm", "post_attention_norm.weight", _H, vector=True),
)

LINEAR = (
    TensorSpec("qkv", "attn_qkv.weight", lambda c: (c.conv_channels, c.hidden_size)),
    TensorSpec("z", "attn_gate.weight", lambda c: (c.n_v_heads * c.head_v_dim, c.hidden_size)),
    TensorSpec("beta", "ssm_beta.weight", lambda c: (c.n_v_heads, c.hidden_size), when=_split),
    TensorSpec("alpha", "ssm_alpha.weight", lambda c: (c.n_v_heads, c.hidden_size), when=_split),
    TensorSpec("ba", "ssm_ba.weight", lambda c: (2 * c.n_v_heads, c.hidden_size), when=_fused),
    TensorSpec("conv_w", "ssm_conv1d.weight", lambda c: (c.conv_channels, c.conv_kernel), vector=True),
    TensorSpec("ssm_a", "ssm_a", lambda c: (c.n_v_heads,), vector=True),          # -exp(A_log)
    TensorSpec("dt_bias", "ssm_dt.bias", lambda c: (c.n_v_heads,), vector=True),
    TensorSpec("ssm_norm", "ssm_norm.weight", lambda c: (c.head_v_dim,), vector=True),
    TensorSpec("ssm_out", "ssm_out.weight", lambda c: (c.hidden_size, c.n_v_heads * c.head_v_dim)),
)

FULL = (
    TensorSpec("q", "attn_q.weight", lambda c: (c.n_heads * 2 * c.head_dim, c.hidden_size)),  # [query | gate]
    TensorSpec("k", "attn_k.weight", lambda c: (c.n_kv_heads * c.head_dim, c.hidden_size)),
    TensorSpec("v", "attn_v.weight", lambda c: (c.n_kv_heads * c.head_dim, c.hidden_size)),
    TensorSpec("o", "attn_output.weight", lambda c: (c.hidden_size, c.n_heads * c.head_dim)),
    TensorSpec("q_norm", "attn_q_norm.weight", lambda c: (c.head_dim,), vector=True),
    TensorSpec("k_norm", "attn_k_norm.weight", lambda c: (c.head_dim,), vector=True),
)

MOE = (
    TensorSpec("router", "ffn_gate_inp.weight", lambda c: (c.n_experts, c.hidden_size)),
    TensorSpec("gate_exps", "ffn_gate_exps.weight", lambda c: (c.n_experts, c.expert_ffn, c.hidden_size)),
    TensorSpec("up_exps", "ffn_up_exps.weight", lambda c: (c.n_experts, c.expert_ffn, c.hidden_size)),
    TensorSpec("down_exps", "ffn_down_exps.weight", lambda c: (c.n_experts, c.hidden_size, c.expert_ffn)),
    TensorSpec("sh_gate", "ffn_gate_shexp.weight", lambda c: (c.shared_ffn, c.hidden_size), when=_shared),
    TensorSpec("sh_up", "ffn_up_shexp.weight", lambda c: (c.shared_ffn, c.hidden_size), when=_shared),
    TensorSpec("sh_down", "ffn_down_shexp.weight", lambda c: (c.hidden_size, c.shared_ffn), when=_shared),
    # the shared expert is scaled by sigmoid(sh_gate_inp . x) when the file has it
    TensorSpec("sh_gate_inp", "ffn_gate_inp_shexp.weight", _H, optional=True, vector=True, when=_shared),
)

# the dense SwiGLU of qwen35: down(silu(gate x) * up x)
DENSE = (
    TensorSpec("ffn_gate", "ffn_gate.weight", lambda c: (c.dense_ffn, c.hidden_size)),
    TensorSpec("ffn_up", "ffn_up.weight", lambda c: (c.dense_ffn, c.hidden_size)),
    TensorSpec("ffn_down", "ffn_down.weight", lambda c: (c.hidden_size, c.dense_ffn)),
)

FFN_SPECS: dict[str, tuple[TensorSpec, ...]] = {"moe": MOE, "dense": DENSE}   # by ModelConfig.ffn_kind

# the MTP block's own tensors; the optional ones fall back to output_norm, token_embd and the LM head
NEXTN = (
    TensorSpec("eh_proj", "nextn.eh_proj.weight", lambda c: (c.hidden_size, 2 * c.hidden_size)),  # [emb | hidden]
    TensorSpec("enorm", "nextn.enorm.weight", _H, vector=True),
    TensorSpec("hnorm", "nextn.hnorm.weight", _H, vector=True),
    TensorSpec("shared_head_norm", "nextn.shared_head_norm.weight", _H, optional=True, vector=True),
    TensorSpec("embed_tokens", "nextn.embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size),
               optional=True),
    TensorSpec("shared_head_head", "nextn.shared_head_head.weight", lambda c: (c.vocab_size, c.hidden_size),
               optional=True),
)

EXPERT_ROLES = ("gate_exps", "up_exps", "down_exps")


def layer_specs(cfg: ModelConfig, layer: int) -> tuple[TensorSpec, ...]:
    """The tensors of block `layer` (a trunk layer, or an MTP block after the trunk)."""
    ffn = FFN_SPECS[cfg.ffn_kind]
    if layer < cfg.n_layers:
        mixer = FULL if cfg.is_full_attention(layer) else LINEAR
        return tuple(s for s in NORMS + mixer + ffn if s.when(cfg))
    # MTP: its mixer is full attention, whatever the trunk's pattern says of this index
    return tuple(s for s in NEXTN + NORMS + FULL + ffn if s.when(cfg))


VECTOR_ROLES = frozenset(s.role for s in GLOBALS + NORMS + LINEAR + FULL + MOE + DENSE + NEXTN if s.vector)


def head_name(names) -> str:
    """The LM head among tensor `names`: output.weight, or the embedding when the file ties them."""
    return "output.weight" if "output.weight" in names else "token_embd.weight"


def fused_ba_rows(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ssm_ba that hold each value head's beta and alpha: (beta rows [nv], alpha rows [nv])."""
    r = cfg.n_v_heads // cfg.n_k_heads
    heads = np.arange(cfg.n_v_heads)
    beta = (heads // r) * 2 * r + heads % r
    return beta, beta + r


Bound = dict[str, Tensor | None]     # role -> tensor; None: an optional tensor the file lacks


@dataclass(frozen=True)
class BoundModel:
    """A model file's tensors by role, checked against the specification."""
    globals: Bound               # embd, out_norm, output (None: tied), head (output or embd)
    layers: list[Bound]          # trunk layers
    mtp: Bound | None = None     # the first MTP block (NEXTN + NORMS + FULL + FFN roles); None: none in the file


def _same_shape(found: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    # ggml pads shapes with 1s, so (1, H) and (H,) are one shape
    def strip(s):
        s = tuple(int(d) for d in s)
        while s and s[0] == 1:
            s = s[1:]
        return s
    return strip(found) == strip(expected)


def bind(model) -> BoundModel:
    """Every tensor of `model` (anything with `config`, `path` and `tensors`: name -> Tensor)
    checked against the specification. Raises one ModelConfigError naming the file and every
    missing tensor, wrong shape and unknown tensor. An MTP block that the metadata counts is
    bound when the file has any of its tensors (then it must have all it needs), else skipped."""
    cfg: ModelConfig = model.config
    tensors: Mapping = model.tensors
    problems: list[str] = []
    seen: set[str] = set()

    def take(name: str, spec: TensorSpec, where: str):
        t = tensors.get(name)
        if t is None:
            if not spec.optional:
                problems.append(f"missing tensor {name} ({where}, role {spec.role}, "
                                f"expected shape {spec.shape(cfg)})")
            return None
        seen.add(name)
        if not _same_shape(t.shape, spec.shape(cfg)):
            problems.append(f"tensor {name} ({where}, role {spec.role}) has shape {tuple(t.shape)}, "
                            f"expected {spec.shape(cfg)}")
        return t

    glob = {s.role: take(s.suffix, s, "global") for s in GLOBALS}
    glob["head"] = tensors.get(head_name(tensors))
    layers, mtp = [], []
    for i in range(cfg.n_layers + cfg.n_nextn_layers):
        specs = layer_specs(cfg, i)
        if i >= cfg.n_layers and not any(f"blk.{i}.{s.suffix}" in tensors for s in specs):
            mtp.append(None)       # metadata counts an MTP block that the file does not carry
            continue
        kind = "MTP" if i >= cfg.n_layers else "full" if cfg.is_full_attention(i) else "linear"
        before = len(problems)
        bound = {s.role: take(f"blk.{i}.{s.suffix}", s, f"{kind} layer {i}") for s in specs}
        (layers if i < cfg.n_layers else mtp).append(bound)
        if i >= cfg.n_layers and any(p.startswith("missing") for p in problems[before:]):
            # first, so that it is listed however many tensors the block lacks
            problems.insert(before, f"the MTP block blk.{i} is incomplete: a file carries all of it or none")
    unknown = [n for n in tensors if n not in seen]
    if unknown:
        names = ", ".join(unknown[:MAX_LISTED])
        if len(unknown) > MAX_LISTED:
            names += f" and {len(unknown) - MAX_LISTED} more"
        if not cfg.has_shared_expert and any("shexp" in n for n in unknown):
            names += f" (shared-expert tensors, but no {cfg.arch}.expert_shared_feed_forward_length)"
        problems.append(f"unknown tensors {names}")
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise ModelConfigError(f"{model.path}: the tensors do not match the {cfg.arch} layer "
                               f"specification (common/model/layers.py):\n  "
                               + "\n  ".join(problems[:MAX_LISTED]) + more)
    return BoundModel(globals=glob, layers=layers, mtp=mtp[0] if mtp else None)
