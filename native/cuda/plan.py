"""The streaming plan of the cuda prefill backend: what stays on the GPU and what streams.

Plain Python (no CUDA import), so it can be tested and printed anywhere. Everything the
backend allocates on the device is counted here, and the total stays within the VRAM budget:

    dense weights (every tensor of the trunk but its FFN's)   resident, always
    LM head                                                   resident if it fits, else streamed
    MoE: experts [0, pinned) of every layer                   resident ("expert pinning")
    MoE: one expert slot, split into `regions` ring regions   streamed experts, a chunk per region
    dense FFN (qwen35): layers [0, ffn_layers) of the FFNs    resident
    dense FFN: a slot of FFN_REGIONS regions, a layer each    the other layers' FFNs, streamed
    activations for `pass_tokens` tokens (one phase at a time)
    recurrent state + KV cache for `max_context` tokens

A prompt runs layer by layer over all of its tokens (up to `pass_tokens` per pass), so each
streamed weight crosses the bus once per pass. Expert pinning takes a prefix of every layer's
experts rather than whole layers: each layer's copy then shrinks by the same share and keeps
overlapping that layer's expert GEMMs. A dense FFN, read whole by every token, pins whole layers
instead, and streams each other layer's FFN into the next region while the layer before computes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from common.errors import UserError
from common.model.config import ModelConfig
from common.model.layers import head_name

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
DENSE_FFN_TENSORS = ("ffn_gate", "ffn_up", "ffn_down")      # layers.DENSE, by GGUF name
FFN_REGIONS = 2                   # streamed dense FFNs: one computes while the next one's copy lands
DEFAULT_BUDGET = 6 << 30
RESERVE_BYTES = 96 << 20          # kernel images, tiny per-call tables, allocator rounding
HEAD_ROWS_BYTES = 64 << 20        # logits rows computed per LM-head launch
F32 = 4



class VramBudgetError(UserError, ValueError):
    """A VRAM budget that cannot hold the plan's fixed part (weights, activations, state + KV)."""


_SIZE = re.compile(r"^\s*([\d.]+)\s*([kmgt]?)(i?)b?\s*$", re.I)


def parse_size(value: int | float | str) -> int:
    """'6GiB', '6G', '512MiB', 6442450944 -> bytes (powers of 1024 for GiB, 1000 for GB)."""
    if isinstance(value, (int, float)):
        return int(value)
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"cannot read {value!r} as a size; use e.g. 6GiB, 512MiB or a byte count")
    number, unit, binary = float(m.group(1)), m.group(2).lower(), m.group(3)
    power = "_kmgt".index(unit) if unit else 0
    return int(number * (1024 if binary or not unit else 1000) ** power)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.2f} MiB"


def head_rows(cfg: ModelConfig, T: int) -> int:
    """Token rows per LM-head launch."""
    return max(1, min(T, HEAD_ROWS_BYTES // (cfg.vocab_size * F32)))


def workspace_bytes(cfg: ModelConfig, T: int) -> dict[str, dict[str, int]]:
    """Activation buffers for T tokens, by phase. Phases never overlap, so they share memory."""
    H, V, E, k, Fd = cfg.hidden_size, cfg.vocab_size, cfg.n_experts, cfg.n_experts_used, cfg.dense_ffn
    nv, dk, dv = cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    C, F, Fs = cfg.conv_channels, cfg.expert_ffn, cfg.shared_ffn
    rows = -(-T // 64) * 64
    tiles = (T * k // 32 + E + 1) * 4
    hr = head_rows(cfg, T)
    return {
        "keep": {"x": T * H * F32, "xn": T * H * F32, "rope": T * max(cfg.rope_dim, 2) * F32,
                 "tiles": (-(-T // 64)) * 16, "woff": 2 * 3 * E * 8,      # two expert address tables
                 "shared_woff": cfg.n_layers * 2 * 8},                 # per layer: shared gate, up addresses
        "linear": {"qkv": T * C * F32, "conv": T * C * F32, "z": T * nv * dv * F32,
                   "alpha": T * nv * F32, "beta": T * nv * F32, "o": T * nv * dv * F32,
                   "gcum": rows * nv * F32, "aqk": rows * 64 * nv * F32,
                   "u": rows * nv * dv * F32, "wk": rows * nv * dk * F32},
        "full": {"q2": T * nh * 2 * hd * F32, "q": T * nh * hd * F32, "kraw": T * nkv * hd * F32,
                 "att": T * nh * hd * F32},
        "moe": {"logits": T * E * F32, "ids": T * k * 4, "w": T * k * F32, "tok": T * k * 4,
                "pos": T * k * 4, "tiles": tiles * 4,
                "counts": E * 4, "cursor": E * 4, "g": T * k * F * F32,
                "u": T * k * F * F32, "down": T * k * H * F32, "sg": T * F32,
                "shg": T * Fs * F32, "shu": T * Fs * F32, "shd": T * H * F32},
        "ffn": {"g": T * Fd * F32, "u": T * Fd * F32},
        "head": {"logits": hr * V * F32, "tiles": -(-hr // 64) * 16},
    }


def layout(phases: dict[str, dict[str, int]], align: int = 256) -> tuple[dict[str, dict[str, int]], int]:
    """Byte offsets of every buffer: `keep` first, then each other phase over the same span."""
    def place(sizes: dict[str, int], start: int) -> tuple[dict[str, int], int]:
        out, off = {}, start
        for name, n in sizes.items():
            out[name] = off
            off += -(-n // align) * align
        return out, off
    offsets, end = {}, 0
    offsets["keep"], base = place(phases["keep"], 0)
    for phase, sizes in phases.items():
        if phase != "keep":
            offsets[phase], stop = place(sizes, base)
            end = max(end, stop)
    return offsets, max(end, base)


def state_bytes(cfg: ModelConfig, max_context: int) -> int:
    lin, full = len(cfg.linear_layers), len(cfg.full_layers)
    ssm = cfg.n_v_heads * cfg.head_k_dim * cfg.head_v_dim * F32
    conv = cfg.conv_channels * (cfg.conv_kernel - 1) * F32
    kv = 2 * max_context * cfg.n_kv_heads * cfg.head_dim * F32
    return lin * (ssm + conv) + full * kv


@dataclass(frozen=True)
class StreamPlan:
    budget: int
    pass_tokens: int
    max_context: int
    dense_bytes: int
    head_bytes: int
    head_resident: bool
    n_experts: int
    expert_bytes: int            # one expert's gate+up+down bytes (largest layer)
    pinned_experts: int          # experts [0, pinned) of every layer stay resident
    pinned_bytes: int            # the resident experts', or the resident dense FFNs' bytes
    slot_bytes: int
    regions: int
    workspace_bytes: int
    state_bytes: int
    reserve_bytes: int
    streamed_bytes_per_pass: int  # if every non-pinned expert is routed to
    ffn_bytes: int = 0           # a dense FFN: one layer's gate+up+down bytes (largest layer); 0: MoE
    ffn_layers: int = 0          # a dense FFN: layers [0, ffn_layers) keep theirs resident
    least_slot_bytes: int = 0    # the smallest slot that streams (the budget's test): `regions` experts, or one FFN

    @property
    def total_bytes(self) -> int:
        return (self.dense_bytes + (self.head_bytes if self.head_resident else 0) + self.pinned_bytes
                + self.slot_bytes + self.workspace_bytes + self.state_bytes + self.reserve_bytes)

    @property
    def region_bytes(self) -> int:
        return self.slot_bytes // self.regions

    def describe(self) -> list[str]:
        return [
            f"VRAM budget {gib(self.budget)}: planned {gib(self.total_bytes)}",
            f"  resident dense weights {gib(self.dense_bytes)}; LM head {gib(self.head_bytes)} "
            f"{'resident' if self.head_resident else 'streamed'}",
            (f"  resident dense FFNs {self.ffn_layers} layers ({gib(self.pinned_bytes)})" if self.ffn_bytes else
             f"  pinned experts {self.pinned_experts}/{self.n_experts} per layer ({gib(self.pinned_bytes)})"),
            f"  streaming slot {gib(self.slot_bytes)} in {self.regions} regions "
            + (f"(one layer's FFN {self.ffn_bytes / 2**20:.2f} MiB)" if self.ffn_bytes else
               f"(one expert {self.expert_bytes / 2**20:.2f} MiB)"),
            f"  activations for {self.pass_tokens} tokens per pass {gib(self.workspace_bytes)}; "
            f"state + KV for {self.max_context} tokens {gib(self.state_bytes)}",
            f"  streamed per pass at most {gib(self.streamed_bytes_per_pass)}",
        ]


def classify(cfg: ModelConfig, name: str) -> str:
    """'expert', 'ffn' (a dense FFN's), 'dense', 'head', 'host' (embedding rows, gathered on the
    host) or 'skip'."""
    if name == "output.weight":
        return "head"
    if name == "token_embd.weight":
        return "host"
    m = re.match(r"blk\.(\d+)\.(.+?)(\.weight|\.bias)?$", name)
    if m:
        if int(m.group(1)) >= cfg.n_layers:
            return "skip"                                   # MTP blocks
        if m.group(2) in EXPERT_TENSORS:
            return "expert"
        return "ffn" if m.group(2) in DENSE_FFN_TENSORS else "dense"
    return "dense"


def make_plan(cfg: ModelConfig, tensor_bytes: dict[str, int], *, budget: int = DEFAULT_BUDGET,
              pass_tokens: int = 4096, max_context: int = 8192, regions: int = 8) -> StreamPlan:
    kinds = {n: classify(cfg, n) for n in tensor_bytes}
    dense = sum(b for n, b in tensor_bytes.items() if kinds[n] == "dense")
    head = tensor_bytes[head_name(tensor_bytes)]
    ws = layout(workspace_bytes(cfg, pass_tokens))[1]
    st = state_bytes(cfg, max_context)
    fixed = dense + ws + st + RESERVE_BYTES
    part = _STREAMED[cfg.ffn_kind](cfg, tensor_bytes, regions)
    if fixed + part.least > budget:
        room = budget - (fixed - st) - part.least              # what the state and KV could have
        fits = (room - state_bytes(cfg, 0)) // (state_bytes(cfg, 1) - state_bytes(cfg, 0)) if room > 0 else 0
        raise VramBudgetError(
            f"a VRAM budget of {gib(budget)} is too small: dense weights {gib(dense)}, activations for "
            f"{pass_tokens} tokens {gib(ws)}, state + KV for {max_context} tokens {gib(st)} and a minimal "
            f"{part.what} {gib(part.least)} need {gib(fixed + part.least)}; "
            f"raise --vram-budget or lower --ctx-size"
            + (f" (at most {fits} tokens fit this budget)" if fits > 0 else ""))
    head_resident = fixed + head + part.least <= budget
    avail = budget - fixed - (head if head_resident else 0)
    fields = part.fit(avail, head_resident, head)
    fields["slot_bytes"] -= fields["slot_bytes"] % (fields["regions"] * 256)
    return StreamPlan(budget=budget, pass_tokens=pass_tokens, max_context=max_context, dense_bytes=dense,
                      head_bytes=head, head_resident=head_resident, workspace_bytes=ws, state_bytes=st,
                      reserve_bytes=RESERVE_BYTES, least_slot_bytes=part.least, **fields)


@dataclass(frozen=True)
class _Streamed:
    """The FFN weights that may stream: the least slot that runs, and the fit of the rest."""
    what: str                                  # the least slot, in words
    least: int
    fit: Callable[[int, bool, int], dict]      # (bytes available, head resident, head bytes) -> plan fields


def _experts(cfg: ModelConfig, tensor_bytes: dict[str, int], regions: int) -> _Streamed:
    E = cfg.n_experts
    per_layer = [sum(tensor_bytes.get(f"blk.{i}.{t}.weight", 0) for t in EXPERT_TENSORS) // E
                 for i in range(cfg.n_layers)]
    expert, all_experts = max(per_layer), sum(per_layer)

    def fit(avail: int, head_resident: bool, head: int) -> dict:
        # with a slot for a whole layer's streamed experts: avail = pinned * all_experts + (E - pinned) * expert
        pinned, n_regions = 0, regions
        if avail >= E * expert and all_experts > expert:
            pinned = min(E, (avail - E * expert) // (all_experts - expert))
        left = avail - pinned * all_experts
        if pinned < E:
            slot = min(left, (E - pinned) * expert)
            n_regions = max(1, min(regions, E - pinned))
        else:
            slot = 0 if head_resident else min(left, head)
            n_regions = 1
        return dict(n_experts=E, expert_bytes=expert, pinned_experts=int(pinned),
                    pinned_bytes=int(pinned * all_experts), slot_bytes=int(slot), regions=n_regions,
                    streamed_bytes_per_pass=int((E - pinned) * all_experts) + (0 if head_resident else head))
    return _Streamed(f"expert slot ({regions} experts)", regions * expert, fit)


def ffn_offsets(tensor_bytes: dict[str, int], layer: int) -> tuple[int, ...]:
    """Where a streamed dense FFN's gate, up and down start in its region, 256-byte aligned, and the
    bytes it takes there: (gate, up, down, size)."""
    out, off = [], 0
    for t in DENSE_FFN_TENSORS:
        out.append(off)
        off += -(-tensor_bytes.get(f"blk.{layer}.{t}.weight", 0) // 256) * 256
    return (*out, off)


def _dense_ffns(cfg: ModelConfig, tensor_bytes: dict[str, int], regions: int) -> _Streamed:
    per_layer = [ffn_offsets(tensor_bytes, i)[-1] for i in range(cfg.n_layers)]
    ffn, L = max(per_layer), cfg.n_layers
    resident_upto = np.concatenate([[0], np.cumsum(per_layer)])   # bytes of layers [0, k)

    def fit(avail: int, head_resident: bool, head: int) -> dict:
        # every layer's FFN resident, and a streamed head a slot of at least one FFN's size to pass through
        if resident_upto[L] + (0 if head_resident else ffn) <= avail:
            k, slot, n_regions = L, (0 if head_resident else min(avail - int(resident_upto[L]), head)), 1
        else:   # the most layers that leave a slot of up to FFN_REGIONS regions for the others
            k = 0
            while k < L and resident_upto[k + 1] + min(FFN_REGIONS, L - k - 1) * ffn <= avail:
                k += 1
            n_regions = max(1, min(FFN_REGIONS, L - k, (avail - int(resident_upto[k])) // ffn))
            slot = n_regions * ffn
        return dict(n_experts=0, expert_bytes=0, pinned_experts=0, pinned_bytes=int(resident_upto[k]),
                    slot_bytes=int(slot), regions=n_regions, ffn_bytes=ffn, ffn_layers=k,
                    streamed_bytes_per_pass=int(resident_upto[L] - resident_upto[k]) + (0 if head_resident else head))
    return _Streamed("slot for one layer's FFN", ffn, fit)


_STREAMED: dict[str, Callable[[ModelConfig, dict[str, int], int], _Streamed]] = {
    "moe": _experts, "dense": _dense_ffns}     # by ModelConfig.ffn_kind
