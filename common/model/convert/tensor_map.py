"""HF tensor names -> llama.cpp GGUF tensors, with the transforms llama.cpp applies.

- norms become 1 + w, except the gated `linear_attn.norm` (ssm_norm);
- A_log becomes ssm_a = -exp(A_log); dt_bias becomes ssm_dt.bias; conv1d is squeezed to (C, K);
- qwen35moe and qwen35: V heads go from grouped-by-key-head to tiled order (value head p reads key head
  p % n_k) in every tensor that has a V-head axis;
- qwen3next: in_proj_qkvz (per key head [q, k, v, z]) splits into attn_qkv = [all q, all k,
  all v] and attn_gate = z; in_proj_ba stays as ssm_ba;
- experts, per expert or fused, are stacked per layer into ffn_{gate,up,down}_exps;
- the MTP block, as llama.cpp's converter writes it: `mtp.layers.K.*` is block n_layers + K with
  a trunk layer's names and transforms, and `mtp.fc` / `pre_fc_norm_embedding` /
  `pre_fc_norm_hidden` / `norm` are that block's nextn eh_proj / enorm / hnorm /
  shared_head_norm (the norms 1 + w).

Each planned tensor knows its output shape before any data is read, so the writer can lay
out the file first and then load, transform and write one tensor at a time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .arch import Arch
from .errors import ConvertError
from .hf_reader import MTP_PREFIX, Checkpoint

Fn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class OutTensor:
    name: str
    shape: tuple[int, ...]             # numpy order, (out, in)
    load: Callable[[], np.ndarray]     # float32, already transformed


@dataclass(frozen=True)
class Heads:
    nk: int          # key heads
    nv: int          # value heads
    dk: int
    dv: int

    @property
    def r(self) -> int:
        return self.nv // self.nk

    @classmethod
    def from_config(cls, hp: dict) -> "Heads":
        return cls(hp["linear_num_key_heads"], hp["linear_num_value_heads"],
                   hp["linear_key_head_dim"], hp["linear_value_head_dim"])


def tile_v_heads(a: np.ndarray, axis: int, h: Heads, head_dim: int) -> np.ndarray:
    """Reorder a V-head axis of size nv*head_dim from grouped (nk, r) to tiled (r, nk)."""
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(h.nk, h.r, head_dim, *rest).swapaxes(0, 1).reshape(h.nv * head_dim, *rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def _plus_one(a: np.ndarray) -> np.ndarray:
    return a + 1.0


def _neg_exp(a: np.ndarray) -> np.ndarray:
    return (-np.exp(a.astype(np.float64))).astype(np.float32)


def _identity(a: np.ndarray) -> np.ndarray:
    return a


def _linear_rules(arch: Arch, h: Heads) -> dict[str, tuple[str, Fn]]:
    """linear_attn.* suffix -> (GGUF suffix, transform)."""
    tile = arch.tiled_v_heads and h.nk != h.nv
    qk = 2 * h.nk * h.dk

    def v(axis: int, head_dim: int, after: Fn = _identity) -> Fn:
        if not tile:
            return after
        return lambda a: tile_v_heads(after(a), axis, h, head_dim)

    def qkv(a: np.ndarray) -> np.ndarray:      # rows [q | k | v]: only the V rows move
        if not tile:
            return a
        return np.concatenate([a[:qk], tile_v_heads(a[qk:], 0, h, h.dv)])

    def conv(a: np.ndarray) -> np.ndarray:     # (C, 1, K) -> (C, K); V channels move
        return qkv(a.reshape(a.shape[0], a.shape[-1]))

    return {
        "in_proj_qkv.weight": ("attn_qkv.weight", qkv),
        "in_proj_z.weight": ("attn_gate.weight", v(0, h.dv)),
        "in_proj_a.weight": ("ssm_alpha.weight", v(0, 1)),
        "in_proj_b.weight": ("ssm_beta.weight", v(0, 1)),
        "in_proj_ba.weight": ("ssm_ba.weight", _identity),
        "A_log": ("ssm_a", v(0, 1, _neg_exp)),
        "dt_bias": ("ssm_dt.bias", v(0, 1)),
        "conv1d.weight": ("ssm_conv1d.weight", conv),
        "norm.weight": ("ssm_norm.weight", _identity),
        "out_proj.weight": ("ssm_out.weight", v(1, h.dv)),
    }


LAYER_RULES: dict[str, tuple[str, Fn]] = {
    "input_layernorm.weight": ("attn_norm.weight", _plus_one),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", _plus_one),
    "self_attn.q_proj.weight": ("attn_q.weight", _identity),
    "self_attn.k_proj.weight": ("attn_k.weight", _identity),
    "self_attn.v_proj.weight": ("attn_v.weight", _identity),
    "self_attn.o_proj.weight": ("attn_output.weight", _identity),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", _plus_one),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", _plus_one),
    "mlp.gate.weight": ("ffn_gate_inp.weight", _identity),
    "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", _identity),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", _identity),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", _identity),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", _identity),
    "mlp.gate_proj.weight": ("ffn_gate.weight", _identity),      # qwen35's dense FFN
    "mlp.up_proj.weight": ("ffn_up.weight", _identity),
    "mlp.down_proj.weight": ("ffn_down.weight", _identity),
}

GLOBAL_RULES: dict[str, tuple[str, Fn]] = {
    "model.embed_tokens.weight": ("token_embd.weight", _identity),
    "model.norm.weight": ("output_norm.weight", _plus_one),
    "lm_head.weight": ("output.weight", _identity),
}

# the MTP block's own tensors; its layer's are mtp.layers.K.* under LAYER_RULES
NEXTN_RULES: dict[str, tuple[str, Fn]] = {
    "mtp.fc.weight": ("nextn.eh_proj.weight", _identity),
    "mtp.pre_fc_norm_embedding.weight": ("nextn.enorm.weight", _plus_one),
    "mtp.pre_fc_norm_hidden.weight": ("nextn.hnorm.weight", _plus_one),
    "mtp.norm.weight": ("nextn.shared_head_norm.weight", _plus_one),
}

IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERT = re.compile(r"^mlp\.experts\.(gate_up|down)_proj(\.weight)?$")


def _out_shape(gguf_suffix: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[-1]) if gguf_suffix == "ssm_conv1d.weight" else shape


class _Planner:
    def __init__(self, ckpt: Checkpoint, arch: Arch, hp: dict):
        self.ckpt, self.arch, self.hp = ckpt, arch, hp
        self.linear = _linear_rules(arch, Heads.from_config(hp))
        self.out: list[OutTensor] = []

    def single(self, name: str, hf: str, fn: Fn, shape: tuple[int, ...]) -> None:
        self.out.append(OutTensor(name, shape, lambda: fn(self.ckpt.get(hf))))

    def layer(self, i: int, suffixes: dict[str, str]) -> None:
        experts: dict[str, dict[int, str]] = {"gate": {}, "up": {}, "down": {}}
        for suffix, hf in suffixes.items():
            shape = self.ckpt.shape(hf)
            if suffix in LAYER_RULES:
                gname, fn = LAYER_RULES[suffix]
            elif suffix.startswith("linear_attn.") and suffix[12:] in self.linear:
                gname, fn = self.linear[suffix[12:]]
            elif suffix == "linear_attn.in_proj_qkvz.weight":
                self.qkvz(i, hf, shape)
                continue
            elif m := _EXPERT.match(suffix):
                experts[m.group(2)][int(m.group(1))] = hf
                continue
            elif m := _FUSED_EXPERT.match(suffix):
                self.fused_experts(i, m.group(1), hf, shape)
                continue
            else:
                raise ConvertError(self.ckpt.src, f"tensor {hf} has no GGUF mapping")
            self.single(f"blk.{i}.{gname}", hf, fn, _out_shape(gname, shape))
        for proj, by_index in experts.items():
            if by_index:
                self.stacked_experts(i, proj, by_index)

    def stacked_experts(self, i: int, proj: str, by_index: dict[int, str]) -> None:
        n = int(self.hp["num_experts"])
        missing = sorted(set(range(n)) - set(by_index))
        if missing:
            raise ConvertError(self.ckpt.src, f"layer {i}: {proj}_proj missing for experts "
                                              f"{missing[:8]} (num_experts={n})")
        names = [by_index[e] for e in range(n)]
        shape = (n, *self.ckpt.shape(names[0]))
        self.out.append(OutTensor(f"blk.{i}.ffn_{proj}_exps.weight", shape,
                                  lambda: np.stack([self.ckpt.get(x) for x in names])))

    def fused_experts(self, i: int, kind: str, hf: str, shape: tuple[int, ...]) -> None:
        if kind == "down":                         # (E, H, F)
            self.single(f"blk.{i}.ffn_down_exps.weight", hf, _identity, shape)
            return
        e, two_f, hidden = shape                   # (E, 2F, H): gate rows then up rows
        f = two_f // 2
        for proj, rows in (("gate", slice(0, f)), ("up", slice(f, two_f))):
            self.out.append(OutTensor(f"blk.{i}.ffn_{proj}_exps.weight", (e, f, hidden),
                                      lambda rows=rows: self.ckpt.get(hf, (slice(None), rows))))

    def qkvz(self, i: int, hf: str, shape: tuple[int, ...]) -> None:
        h = Heads.from_config(self.hp)
        parts = [h.dk, h.dk, h.r * h.dv, h.r * h.dv]     # per key head: q, k, v, z rows
        hidden = shape[1]
        cuts = np.cumsum(parts)[:-1]

        def split(a: np.ndarray) -> list[np.ndarray]:
            return np.split(a.reshape(h.nk, sum(parts), hidden), cuts, axis=1)

        def qkv(a: np.ndarray) -> np.ndarray:
            return np.concatenate([p.reshape(-1, hidden) for p in split(a)[:3]])

        self.single(f"blk.{i}.attn_qkv.weight", hf, qkv,
                    (h.nk * (2 * h.dk + h.r * h.dv), hidden))
        self.single(f"blk.{i}.attn_gate.weight", hf, lambda a: split(a)[3].reshape(-1, hidden),
                    (h.nk * h.r * h.dv, hidden))


def mtp_blocks(ckpt: Checkpoint) -> int:
    """How many MTP blocks the checkpoint carries (`mtp.layers.K`, K = 0 .. n-1); 0 without mtp.*."""
    found = {int(m.group(1)) for hf in ckpt.names() if (m := _MTP_LAYER.match(hf))}
    if found and found != set(range(len(found))):
        raise ConvertError(ckpt.src, f"MTP layers {sorted(found)} are not numbered 0 .. {len(found) - 1}")
    if not found and any(hf.startswith(MTP_PREFIX) for hf in ckpt.names()):
        raise ConvertError(ckpt.src, "mtp.* tensors without an mtp.layers.0 block (convert with --no-mtp "
                                     "to drop them)")
    return len(found)


def plan(ckpt: Checkpoint, arch: Arch, hp: dict, mtp: bool = True) -> list[OutTensor]:
    """Output tensors in file order: token_embd, the layers, the MTP blocks (when `mtp` and the
    checkpoint has them), output_norm, output."""
    p = _Planner(ckpt, arch, hp)
    layers: dict[int, dict[str, str]] = {}
    globals_: dict[str, str] = {}
    nextn: list[str] = []
    n_layers = int(hp["num_hidden_layers"])
    for hf in ckpt.names():
        if IGNORED.search(hf):
            continue
        if hf.startswith(MTP_PREFIX):
            if not mtp:
                continue
            if m := _MTP_LAYER.match(hf):
                layers.setdefault(n_layers + int(m.group(1)), {})[m.group(2)] = hf
            elif hf in NEXTN_RULES:
                nextn.append(hf)
            else:
                raise ConvertError(ckpt.src, f"tensor {hf} has no GGUF mapping")
        elif m := _LAYER.match(hf):
            i = int(m.group(1))
            if i >= n_layers:
                raise ConvertError(ckpt.src, f"tensor {hf} is beyond num_hidden_layers={n_layers}")
            layers.setdefault(i, {})[m.group(2)] = hf
        elif hf in GLOBAL_RULES:
            globals_[hf] = hf
        else:
            raise ConvertError(ckpt.src, f"tensor {hf} has no GGUF mapping")
    if "model.embed_tokens.weight" not in globals_:
        raise ConvertError(ckpt.src, "missing tensor model.embed_tokens.weight")
    ordered = [n for n in GLOBAL_RULES if n in globals_]      # embed first, head last
    gname, fn = GLOBAL_RULES[ordered[0]]
    p.single(gname, ordered[0], fn, ckpt.shape(ordered[0]))
    for i in sorted(layers):
        if i == n_layers:                                      # the first MTP block: its nextn tensors first
            for hf in nextn:
                gname, fn = NEXTN_RULES[hf]
                p.single(f"blk.{i}.{gname}", hf, fn, ckpt.shape(hf))
        p.layer(i, layers[i])
    for hf in ordered[1:]:
        gname, fn = GLOBAL_RULES[hf]
        p.single(gname, hf, fn, ckpt.shape(hf))
    return p.out
