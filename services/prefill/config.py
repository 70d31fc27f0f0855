"""Prefill worker configuration."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config import GIB, WorkerConfig, setting


@dataclass(frozen=True)
class PrefillConfig(WorkerConfig):
    backend: str = setting("cpu", "Prefill backend: cpu, cuda.")
    device: int = setting(0, "GPU index (cuda backend).")
    vram_budget: int | None = setting(None, "GiB of GPU memory to use (cuda backend).", unit=GIB)   # bytes
    backend_options: dict = field(default_factory=dict)      # more keyword arguments of the backend

    def backend_kwargs(self) -> dict:
        """backend_options, with device and a set vram_budget for the cuda backend."""
        cuda = {"device": self.device, **({"vram_budget": self.vram_budget} if self.vram_budget else {})}
        return {**(cuda if self.backend == "cuda" else {}), **self.backend_options}
