"""Weights on the device for the cuda prefill backend: the resident block, the host-side
pinned store of streamed experts, and the ring of slot regions that they stream through.

Lifecycle: `DeviceArena` owns every device allocation (its peak is the backend's peak);
`ResidentWeights` uploads the dense tensors, the resident LM head and the pinned experts once;
`HostExperts` (staging.py) stages the streamed experts in page-locked host memory;
`ExpertStreamer` moves the routed, non-resident experts of one layer at a time on its own
copy stream, one chunk per slot region, with events in both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from common.model.layers import EXPERT_ROLES, VECTOR_ROLES, bind, fused_ba_rows

from .plan import DENSE_FFN_TENSORS, EXPERT_TENSORS, StreamPlan
from .staging import HostExperts  # noqa: F401 (the backend takes all three from here)

ALIGN = 256


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class DeviceArena:
    """Every device allocation of the backend, counted."""

    def __init__(self, cuda):
        self.cuda, self.allocs, self.bytes, self.peak = cuda, {}, 0, 0

    def alloc(self, what: str, nbytes: int) -> int:
        nbytes = max(_align(nbytes), ALIGN)
        mem = self.cuda.mem_alloc(nbytes)
        self.allocs[what] = mem
        self.bytes += nbytes
        self.peak = max(self.peak, self.bytes)
        return int(mem)

    def free(self) -> None:
        for mem in self.allocs.values():
            mem.free()
        self.allocs.clear()
        self.bytes = 0


@dataclass(frozen=True)
class DevTensor:
    ptr: int
    qtype: Q
    N: int                # output rows (experts: per expert)
    K: int                # inner dimension
    row_bytes: int


def _ba_split(cfg, raw: np.ndarray) -> np.ndarray:
    """Fused ssm_ba rows (per key head: r beta rows, r alpha rows) -> [beta (nv); alpha (nv)]."""
    return np.ascontiguousarray(raw[np.concatenate(fused_ba_rows(cfg))])


class ResidentWeights:
    """Dense tensors (GEMM weights in their blocks, vectors as f32), the head if resident, and
    experts [0, pinned) of every layer, or the dense FFNs of layers [0, ffn_layers), uploaded once
    into one allocation.

    Keys: (layer, role) for a layer's tensors (common/model/layers.py), a fused ssm_ba split
    into its "beta" and "alpha" rows; "output_norm.weight" and "head" for the globals."""

    def __init__(self, cuda, arena: DeviceArena, model, plan: StreamPlan):
        cfg = model.config
        self.bound = bind(model)
        self.tensors: dict = {}
        self.experts: dict[tuple[int, str], DevTensor] = {}   # (layer, tensor) -> pinned experts
        uploads: list[tuple[object, np.ndarray, DevTensor]] = []
        offset = 0

        def add(key, data: np.ndarray, qtype: Q, N: int, K: int, row_bytes: int):
            nonlocal offset
            uploads.append((key, data, DevTensor(offset, qtype, N, K, row_bytes)))
            offset += _align(data.nbytes)

        def dense(key, role: str, t) -> None:
            if role in VECTOR_ROLES:
                v = np.ascontiguousarray(t.dequant(), dtype=np.float32)
                add(key, v, Q.F32, 1 if v.ndim == 1 else v.shape[0], v.shape[-1], v.shape[-1] * 4)
            else:
                add(key, t.raw, t.qtype, t.shape[0], t.shape[-1], t.row_bytes)

        expert_name = dict(zip(EXPERT_ROLES, EXPERT_TENSORS))
        for i, tensors in enumerate(self.bound.layers):
            for role, t in tensors.items():
                if t is None:
                    continue
                if role == "ba":
                    raw = _ba_split(cfg, t.raw)
                    half = raw.shape[0] // 2
                    add((i, "beta"), raw[:half], t.qtype, half, t.shape[-1], t.row_bytes)
                    add((i, "alpha"), raw[half:], t.qtype, half, t.shape[-1], t.row_bytes)
                elif role in DENSE_FFN_TENSORS and i >= plan.ffn_layers:
                    continue                                        # streamed (HostExperts)
                elif role in expert_name:
                    if plan.pinned_experts:
                        raw = t.raw[:plan.pinned_experts]
                        add(("pinned", i, expert_name[role]), raw, t.qtype, t.shape[1], t.shape[2], t.row_bytes)
                else:
                    dense((i, role), role, t)
        dense("output_norm.weight", "out_norm", self.bound.globals["out_norm"])
        self.head_tensor = head = self.bound.globals["head"]
        if plan.head_resident:
            add("head", head.raw, head.qtype, head.shape[0], head.shape[-1], head.row_bytes)

        self.base = arena.alloc("resident weights", offset)
        for key, data, dt in uploads:
            ptr = self.base + dt.ptr
            cuda.memcpy_htod(ptr, np.ascontiguousarray(data))
            placed = DevTensor(ptr, dt.qtype, dt.N, dt.K, dt.row_bytes)
            if isinstance(key, tuple) and key[0] == "pinned":
                self.experts[key[1:]] = placed
            else:
                self.tensors[key] = placed
        self.nbytes = offset

    def __getitem__(self, key) -> DevTensor:
        return self.tensors[key]
