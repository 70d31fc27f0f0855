"""Decode worker configuration."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeConfig:
    model: str                               # GGUF path
    router: str = "tcp://127.0.0.1:5560"     # the router's worker inbox
    listen: str = "tcp://127.0.0.1:0"        # this worker's inbox (:0 picks a free port)
    advertise: str | None = None             # inbox address as others reach it (other hosts)
    runner: str = "auto"                     # native | reference | auto (native when it loads)
    max_batch: int = 16                      # sequences per decode step
    capacity: int = 64                       # sequences held at once (running + waiting)
    metrics_port: int = 0
    ready_timeout: float = 30.0
    worker_token: str | None = None          # shown to the router; None: common.worker_token's default
