"""The cuda backend's vision tower (--mmproj): where it runs, and the VRAM it takes.

The tower's weights and the scratch for the largest image it takes (its max_pixels) come off the top
of the VRAM budget before the text model's streaming plan is made (native/cuda/plan.py), so that the
two never compete for memory mid-request: the plan pins fewer experts instead. `vision` picks:

    auto   on the GPU when the plan's fixed part (dense weights, activations, state + KV, a minimal
           expert slot) still fits beside the tower; else on the CPU, with a warning naming the sizes
    gpu    on the GPU, or a VramBudgetError naming the sizes
    cpu    never on the GPU (the prefill worker's CPU encoder, services/prefill/vision.py)

On the GPU the encoder (native/cuda/vision.py) lives in the backend's own context, and each image
is encoded with that context pushed on the calling thread, as each prefill call is.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.vision.preprocess import Patches
from common.vision.tensors import MmprojFile
from native.cuda.plan import StreamPlan, VramBudgetError, gib, make_plan

log = logging.getLogger("fermium.prefill.cuda")
VISION_PLACES = ("auto", "gpu", "cpu")


@dataclass(frozen=True)
class VisionPlacement:
    mmproj: MmprojFile
    on_gpu: bool
    weight_bytes: int            # the tower on the device
    scratch_bytes: int           # one image of max_patches
    max_patches: int
    why: str                     # a line for the log

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.scratch_bytes if self.on_gpu else 0


def plan_with_vision(cfg, tensor_bytes: dict[str, int], *, budget: int, mmproj: str | Path | None,
                     vision: str = "auto", **plan_options: Any) -> tuple[StreamPlan, VisionPlacement | None]:
    """The text model's plan within what the tower leaves of `budget`, and where the tower runs."""
    from native.cuda.vision import device_bytes, max_patches
    if vision not in VISION_PLACES:
        raise ValueError(f"vision={vision!r}: choose one of {', '.join(VISION_PLACES)}")
    if mmproj is None:
        return make_plan(cfg, tensor_bytes, budget=budget, **plan_options), None
    file = MmprojFile(mmproj)
    weights, scratch = device_bytes(file)
    n = max_patches(file.config)
    sizes = (f"the vision tower {file.path.name} needs {gib(weights)} of weights and {gib(scratch)} of scratch "
             f"for its largest image ({n} patches)")
    if vision == "cpu":
        return (make_plan(cfg, tensor_bytes, budget=budget, **plan_options),
                VisionPlacement(file, False, weights, scratch, n, "vision: on the CPU, as asked (vision='cpu')"))
    if weights + scratch < budget:
        try:
            plan = make_plan(cfg, tensor_bytes, budget=budget - weights - scratch, **plan_options)
            return plan, VisionPlacement(file, True, weights, scratch, n,
                                         f"vision: on the GPU; {sizes}, taken off the VRAM budget of {gib(budget)}")
        except VramBudgetError:
            pass
    both = least_text_bytes(cfg, tensor_bytes, **plan_options) + weights + scratch
    why = (f"{sizes}, and the text model's plan the rest: at least {gib(both)} in all, more than the VRAM budget "
           f"of {gib(budget)}")
    if vision == "gpu":
        raise VramBudgetError(f"vision='gpu': {why}; raise --vram-budget or lower --ctx-size")
    plan = make_plan(cfg, tensor_bytes, budget=budget, **plan_options)
    return plan, VisionPlacement(file, False, weights, scratch, n,
                                 f"vision: on the CPU: {why}; raise --vram-budget to {gib(both)} to run it on the GPU")


def least_text_bytes(cfg, tensor_bytes: dict[str, int], *, regions: int = 8, **plan_options: Any) -> int:
    """The smallest budget the text model's plan takes: its fixed part and a minimal streaming slot
    (make_plan's own test of a budget)."""
    big = make_plan(cfg, tensor_bytes, budget=1 << 62, regions=regions, **plan_options)
    return big.dense_bytes + big.workspace_bytes + big.state_bytes + big.reserve_bytes + big.least_slot_bytes


class GpuVision:
    """The tower on the backend's device: `encode(patches)` with the backend's context pushed."""

    def __init__(self, cuda, ctx, placement: VisionPlacement):
        from native.cuda import vision as cuda_vision
        self.ctx, self.path = ctx, placement.mmproj.path.resolve()
        self.encoder = cuda_vision.CudaVisionEncoder(placement.mmproj, cuda_vision.VisionKernels(), cuda,
                                                     max_patches=placement.max_patches)

    @classmethod
    def load(cls, cuda, ctx, placement: VisionPlacement | None) -> "GpuVision | None":
        """Called with ctx current, as the backend's other allocations are."""
        if placement is not None:
            (log.info if placement.on_gpu else log.warning)(placement.why)
        return cls(cuda, ctx, placement) if placement is not None and placement.on_gpu else None

    @property
    def nbytes(self) -> int:
        return self.encoder.nbytes

    def for_file(self, mmproj: MmprojFile) -> "GpuVision":
        if Path(mmproj.path).resolve() != self.path:
            raise ValueError(f"the cuda backend holds the vision tower {self.path}, not {mmproj.path}")
        return self

    def encode(self, patches: Patches) -> np.ndarray:
        self.ctx.push()
        try:
            return self.encoder.encode(patches)
        finally:
            self.ctx.pop()

    def free(self) -> None:
        """Called with ctx current."""
        self.encoder.free()
