"""Weights on the device for the cuda prefill backend: the resident block, the host-side
pinned store of streamed experts, and the ring of slot regions that they stream through.

Lifecycle: `DeviceArena` owns every device allocation (its peak is the backend's peak);
`ResidentWeights` uploads the dense tensors, the resident LM head and the pinned experts once;
`ExpertStreamer` moves the routed, non-resident experts of one layer at a time on its own
copy stream, one chunk per slot region, with events in both directions.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from .plan import EXPERT_TENSORS, StreamPlan, classify

log = logging.getLogger("fermium.prefill.cuda")
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


def _is_vector(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 or name.endswith("ssm_conv1d.weight")


def _ba_split(cfg, raw: np.ndarray) -> np.ndarray:
    """qwen3next ssm_ba rows (per key head: r beta rows, r alpha rows) -> [beta (nv); alpha (nv)]."""
    nv, r = cfg.n_v_heads, cfg.n_v_heads // cfg.n_k_heads
    heads = np.arange(nv)
    beta_rows = (heads // r) * 2 * r + heads % r
    return np.ascontiguousarray(raw[np.concatenate([beta_rows, beta_rows + r])])


class ResidentWeights:
    """Dense tensors (GEMM weights in their blocks, vectors as f32), the head if resident, and
    experts [0, pinned) of every layer, uploaded once into one allocation."""

    def __init__(self, cuda, arena: DeviceArena, model, plan: StreamPlan):
        cfg = model.config
        self.tensors: dict[str, DevTensor] = {}
        self.experts: dict[tuple[int, str], DevTensor] = {}   # (layer, tensor) -> pinned experts
        uploads: list[tuple[str, np.ndarray, DevTensor]] = []
        offset = 0

        def add(name: str, data: np.ndarray, qtype: Q, N: int, K: int, row_bytes: int):
            nonlocal offset
            uploads.append((name, data, DevTensor(offset, qtype, N, K, row_bytes)))
            offset += _align(data.nbytes)

        head = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"
        for name, t in model.tensors.items():
            kind = classify(cfg, name)
            if kind == "dense" and name.endswith("ssm_ba.weight"):
                p = name[:-len("ssm_ba.weight")]
                raw = _ba_split(cfg, t.raw)
                half = raw.shape[0] // 2
                add(p + "ssm_beta.weight", raw[:half], t.qtype, half, t.shape[-1], t.row_bytes)
                add(p + "ssm_alpha.weight", raw[half:], t.qtype, half, t.shape[-1], t.row_bytes)
            elif kind == "dense" and _is_vector(name, t.shape):
                v = np.ascontiguousarray(t.dequant(), dtype=np.float32)
                add(name, v, Q.F32, 1 if v.ndim == 1 else v.shape[0], v.shape[-1], v.shape[-1] * 4)
            elif kind == "dense":
                add(name, t.raw, t.qtype, t.shape[0], t.shape[-1], t.row_bytes)
            elif kind == "expert" and plan.pinned_experts:
                raw = t.raw[:plan.pinned_experts]
                add(f"pinned:{name}", raw, t.qtype, t.shape[1], t.shape[2], t.row_bytes)
            if name == head and plan.head_resident:
                add("head", t.raw, t.qtype, t.shape[0], t.shape[-1], t.row_bytes)

        self.base = arena.alloc("resident weights", offset)
        for name, data, dt in uploads:
            ptr = self.base + dt.ptr
            cuda.memcpy_htod(ptr, np.ascontiguousarray(data))
            placed = DevTensor(ptr, dt.qtype, dt.N, dt.K, dt.row_bytes)
            if name.startswith("pinned:"):
                m = re.match(r"pinned:blk\.(\d+)\.(\w+)\.weight", name)
                self.experts[(int(m.group(1)), m.group(2))] = placed
            else:
                self.tensors[name] = placed
        self.nbytes = offset
        self.head_tensor = model.tensor(head)

    def __getitem__(self, name: str) -> DevTensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors


class HostExperts:
    """Experts [pinned, E) of every layer in page-locked host memory, ready for async copies.

    The GGUF mapping cannot be registered with the driver, so the bytes are copied once into
    page-locked buffers. If the driver refuses page-locked memory, the copies come straight
    from the mapping (pageable: slower, and they no longer overlap compute); this is logged.
    """

    def __init__(self, cuda, model, plan: StreamPlan):
        cfg = model.config
        self.src: dict[tuple[int, str], np.ndarray] = {}
        self.pinned = True
        already = bool(getattr(model, "host_pinned", False))
        P = plan.pinned_experts
        for i in range(cfg.n_layers):
            for t in EXPERT_TENSORS:
                raw = model.tensor(f"blk.{i}.{t}.weight").raw[P:]
                if already or not self.pinned or raw.size == 0:
                    self.src[(i, t)] = raw
                    continue
                try:
                    buf = cuda.pagelocked_empty(raw.shape, np.uint8)
                except Exception as exc:                      # locked-memory limit, out of memory
                    log.warning("page-locked host memory refused (%s): streaming experts with "
                                "pageable copies; raise `ulimit -l` / LimitMEMLOCK to overlap them", exc)
                    self.pinned = False
                    self.src[(i, t)] = raw
                    continue
                np.copyto(buf, raw)
                self.src[(i, t)] = buf
        if self.pinned and not already:
            log.info("streamed experts staged in %.2f GiB of page-locked host memory",
                     sum(a.nbytes for a in self.src.values()) / 2**30)
