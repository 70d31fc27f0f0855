"""Prefill worker configuration."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config import GIB, WorkerConfig, mmproj_setting, setting
from common.engines import PREFILL, names_text


@dataclass(frozen=True)
class PrefillConfig(WorkerConfig):
    backend: str = setting("cpu", f"Prefill backend: {names_text(PREFILL)}.")
    device: int = setting(0, "GPU index (cuda backend).")
    vram_budget: int | None = setting(None, "GiB of GPU memory to use (cuda backend).", unit=GIB)   # bytes
    mmproj: str | None = mmproj_setting()      # the vision encoder runs here
    held_budget: int = setting(2 << 30, "GiB of RAM for the states this worker keeps for later turns, so the "
                                        "router names them instead of sending them; 0 keeps none.", unit=GIB)  # bytes
    backend_options: dict = field(default_factory=dict)      # more keyword arguments of the backend

    def backend_kwargs(self, ctx_size: int | None = None) -> dict:
        """backend_options, with device, a set vram_budget and, when --ctx-size was given, the
        context size (`ctx_size`: the state and KV it plans room for on the device) for the cuda
        backend; without it the backend keeps its own, which a 6 GiB card holds."""
        cuda = {"device": self.device, **({"vram_budget": self.vram_budget} if self.vram_budget else {}),
                **({"max_context": ctx_size} if ctx_size and self.ctx_size else {}),
                **({"mmproj": self.mmproj} if self.mmproj else {})}      # its VRAM is in the budget
        return {**(cuda if self.backend == "cuda" else {}), **self.backend_options}
