"""Decode worker configuration."""
from __future__ import annotations

from dataclasses import dataclass

from common.config import WorkerConfig, setting


@dataclass(frozen=True)
class DecodeConfig(WorkerConfig):
    runner: str = setting("auto", "Decode runner: native, reference, or auto (native when it loads).",
                          aliases=("engine",))
    max_batch: int = setting(16, "Sequences per decode step.")
    capacity: int = setting(64, "Sequences held at once.")   # running + waiting
