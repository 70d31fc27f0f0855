"""llama-quantize's file types as per-tensor mixes of GGML types, for this architecture.

A file type (Q3_K_M, IQ2_XXS, ...) is a default type and rules that give some tensors another:
the LM head and the embedding, the attention value projections (attn_v, and the linear
layers' fused attn_qkv, which llama.cpp counts with them), the FFN down projections of chosen
layers. The rules here are those of llama.cpp's `llama_tensor_get_type` for a qwen35moe or
qwen35 model: 8 query heads per KV head, many experts (none of its 8-expert cases), an LM head
of its own, and an importance matrix where the type needs one. `file_sizes` prices a file's
tensors under every mix, so that `fermium up` can name the smaller files that would fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Union

from gguf import GGMLQuantizationType as T

from . import QUANTS


@dataclass(frozen=True)
class Slot:
    role: str                    # the name less "blk.N." and ".weight": "attn_qkv", "ffn_down_exps", "output"
    layer: int                   # -1 outside the blocks
    n_layers: int                # blocks in the file (an MTP block counts)


Rule = Union[T, Callable[[Slot], T]]


def more_bits(more: T, rest: T) -> Callable[[Slot], T]:
    """The *_M mixes' layers: the first and last eighth, and every third layer between."""
    def pick(s: Slot) -> T:
        eighth = s.n_layers // 8
        return more if s.layer < eighth or s.layer >= 7 * s.n_layers // 8 or (s.layer - eighth) % 3 == 2 else rest
    return pick


def first_layers(fraction: int, head: T, rest: T) -> Callable[[Slot], T]:
    """`head` in the first n_layers / fraction layers."""
    return lambda s: head if s.layer < s.n_layers // fraction else rest


def below(layers: int, head: T, rest: T) -> Callable[[Slot], T]:
    """`head` in the first `layers` layers (llama.cpp counts those attn_v-like tensors in order)."""
    return lambda s: head if s.layer < layers else rest


def first_down_tensors(head: T, rest: T) -> Callable[[Slot], T]:
    """The i-quant mixes' first n_layers / 8 ffn_down tensors, counted in file order: a MoE
    layer holds two (the experts', then the shared expert's), a dense one one."""
    def pick(s: Slot) -> T:
        rank = s.layer if s.role == "ffn_down" else 2 * s.layer + s.role.endswith("shexp")
        return head if rank < s.n_layers // 8 else rest
    return pick


def middle_layers(middle: T, rest: T) -> Callable[[Slot], T]:
    return lambda s: middle if s.n_layers // 8 <= s.layer < 7 * s.n_layers // 8 else rest


def alternate(even: T, odd: T) -> Callable[[Slot], T]:
    return lambda s: even if s.layer % 2 == 0 else odd


ATTN_V = ("attn_v", "attn_qkv")
EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class Mix:
    name: str
    base: T                      # llama-quantize's default type for the file type
    output: T = T.Q6_K           # output.weight
    embd: T | None = None        # token_embd.weight; None: base
    rules: dict[tuple[str, ...], Rule] = field(default_factory=dict)   # roles -> type; the first match wins
    advised: bool = True         # named to a user whose file is too large (not the ternary types or our own mix)

    def type_of(self, name: str, n_layers: int, layer: int | None = None) -> T:
        """The type of matrix `name` (`layer` overrides the one its name gives)."""
        m = re.match(r"blk\.(\d+)\.", name)
        role = name[m.end() if m else 0:].removesuffix(".weight")
        if role == "output":
            return self.output
        if role == "token_embd":
            return self.embd or self.base
        slot = Slot(role, int(m.group(1)) if layer is None and m else (-1 if layer is None else layer), n_layers)
        for roles, rule in self.rules.items():
            if any(role == r or role.startswith(r + "_") for r in roles):
                return rule if isinstance(rule, T) else rule(slot)
        return self.base


def _float(name: str, qtype: T) -> Mix:
    return Mix(name, qtype, output=qtype)


def _iq2(name: str, base: T, down: T, embd: T, attn_output: T | None = None) -> Mix:
    rules = {ATTN_V: T.Q4_K, ("ffn_down",): first_down_tensors(down, base)}
    return Mix(name, base, T.Q5_K, embd, rules | ({("attn_output",): attn_output} if attn_output else {}))


MIXES: dict[str, Mix] = {m.name: m for m in [
    _float("f32", T.F32), _float("f16", T.F16), _float("bf16", T.BF16),
    Mix("q8_0", T.Q8_0, output=T.Q8_0),
    Mix("q6_k", T.Q6_K),
    Mix("q5_k_m", T.Q5_K, rules={ATTN_V: more_bits(T.Q6_K, T.Q5_K), ("ffn_down",): more_bits(T.Q6_K, T.Q5_K)}),
    Mix("q5_k_s", T.Q5_K),
    Mix("q5_1", T.Q5_1), Mix("q5_0", T.Q5_0),
    Mix("q4_k_m", T.Q4_K, rules={ATTN_V: more_bits(T.Q6_K, T.Q4_K), ("ffn_down",): more_bits(T.Q6_K, T.Q4_K)}),
    Mix("q4_k_s", T.Q4_K, rules={ATTN_V: below(4, T.Q5_K, T.Q4_K), ("ffn_down",): first_layers(8, T.Q5_K, T.Q4_K)}),
    Mix("q4_1", T.Q4_1), Mix("q4_0", T.Q4_0),
    Mix("iq4_xs", T.IQ4_XS, rules={ATTN_V: T.Q5_K, ("ffn_down",): first_layers(8, T.Q5_K, T.IQ4_XS)}),
    Mix("iq4_nl", T.IQ4_NL, rules={ATTN_V: T.Q5_K, ("ffn_down",): first_layers(8, T.Q5_K, T.IQ4_NL)}),
    Mix("mxfp4_moe", T.Q8_0, output=T.Q8_0, rules={EXPERTS: T.MXFP4}),
    Mix("q3_k_l", T.Q3_K, rules={ATTN_V: T.Q5_K, ("ffn_down", "attn_output"): T.Q5_K}),
    Mix("q3_k_m", T.Q3_K, rules={ATTN_V: below(2, T.Q5_K, T.Q4_K), ("ffn_down",): first_layers(16, T.Q5_K, T.Q4_K),
                                 ("attn_output",): T.Q4_K}),
    Mix("q3_k_s", T.Q3_K),
    Mix("iq3_m", T.IQ3_S, rules={ATTN_V: T.Q4_K, ("ffn_down",): first_layers(8, T.Q4_K, T.IQ3_S),
                                 ("attn_output",): T.Q4_K}),
    Mix("iq3_s", T.IQ3_S, rules={ATTN_V: T.Q4_K}),
    Mix("iq3_xs", T.IQ3_S, rules={ATTN_V: T.Q4_K, ("attn_k", "attn_q"): T.IQ3_XXS,
                                  ("ffn_gate", "ffn_up"): middle_layers(T.IQ3_XXS, T.IQ3_S)}),
    Mix("iq3_xxs", T.IQ3_XXS, output=T.Q5_K, embd=T.IQ3_S,
        rules={ATTN_V: T.Q4_K, ("attn_k", "attn_q"): T.IQ2_S, ("attn_output",): T.IQ3_S}),
    Mix("q2_k", T.Q2_K, rules={ATTN_V: T.Q4_K, ("ffn_down", "attn_output"): T.Q3_K}),
    Mix("q2_k_s", T.Q2_K, rules={ATTN_V: T.Q4_K, ("ffn_down",): first_layers(8, T.Q4_K, T.Q2_K)}),
    _iq2("iq2_m", T.IQ2_S, T.IQ3_S, T.IQ3_S, T.IQ3_S),
    _iq2("iq2_s", T.IQ2_XS, T.IQ3_S, T.IQ3_S, T.IQ3_S),
    _iq2("iq2_xs", T.IQ2_XS, T.Q2_K, T.Q2_K),
    _iq2("iq2_xxs", T.IQ2_XXS, T.Q2_K, T.Q2_K),
    _iq2("iq1_m", T.IQ1_M, T.Q2_K, T.Q2_K, T.IQ2_XXS),
    _iq2("iq1_s", T.IQ1_S, T.Q2_K, T.Q2_K, T.IQ2_XXS),
    # ternary: for models trained so, no smaller copy of another
    Mix("tq2_0", T.TQ2_0, embd=T.Q4_K, advised=False), Mix("tq1_0", T.TQ1_0, embd=T.Q4_K, advised=False),
    # the publishers' "dynamic" 4-bit files: attention and shared experts kept at 8 bits, the
    # routed experts at 4 to 6, some in IQ4_XS and MXFP4
    Mix("dynamic", T.Q4_K, rules={
        ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
         "nextn.eh_proj"): T.Q8_0,
        ("attn_qkv",): T.Q6_K, ("attn_gate", "ssm_out"): T.Q5_K,
        ("ffn_gate_exps",): alternate(T.Q4_K, T.IQ4_XS), ("ffn_up_exps",): alternate(T.Q4_K, T.MXFP4),
        ("ffn_down_exps",): more_bits(T.Q6_K, T.Q5_K)}, advised=False),
]}

# llama.cpp's type for a row its choice cannot hold in whole blocks (then F16 if this cannot either)
FALLBACK = {**{q: T.IQ4_NL for q in (T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S,
                                     T.IQ4_XS)},
            **{q: T.Q4_0 for q in (T.Q2_K, T.Q3_K, T.TQ1_0, T.TQ2_0)},
            T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_KEPT = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight")   # llama-quantize leaves these


def fit_row(qtype: T, row: int) -> T:
    if row % QUANTS[qtype].block == 0:
        return qtype
    qtype = FALLBACK.get(qtype, T.F16)
    return qtype if row % QUANTS[qtype].block == 0 else T.F16


def quantized(name: str, shape: tuple[int, ...]) -> bool:
    """Whether llama-quantize gives this tensor the file type's choice (else it keeps its type)."""
    return len(shape) >= 2 and name.endswith("weight") and not name.endswith(_KEPT)


def file_sizes(tensors: Iterable[tuple[str, tuple[int, ...], int]]) -> dict[str, int]:
    """Bytes of the file of each mix from (name, shape (numpy order), bytes now) of a file's
    tensors; the tensors that llama-quantize keeps count at their bytes now."""
    tensors = list(tensors)
    n_layers = 1 + max((int(m.group(1)) for n, _, _ in tensors if (m := re.match(r"blk\.(\d+)\.", n))), default=-1)
    sizes = dict.fromkeys(MIXES, 0)
    for name, shape, nbytes in tensors:
        rows = 1
        for n in shape[:-1]:
            rows *= n
        for mix in MIXES.values():
            if not quantized(name, shape):
                sizes[mix.name] += nbytes
                continue
            q = QUANTS[fit_row(mix.type_of(name, n_layers), shape[-1])]
            sizes[mix.name] += rows * (shape[-1] // q.block) * q.block_bytes
    return sizes
