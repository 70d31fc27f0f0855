"""Router configuration."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterConfig:
    model: str                                  # GGUF path (tokenizer, chat template, context length)
    host: str = "127.0.0.1"                     # HTTP API
    port: int = 8000
    workers: str = "tcp://127.0.0.1:5560"       # inbox that workers register and report to
    served_model_name: str = "fermium"          # the `model` clients ask for (the file stem works too)
    max_model_len: int = 0                      # 0: the model's context length
    max_running: int = 64                       # requests dispatched to workers at once
    max_queue: int = 256                        # requests waiting for a slot; beyond that, 429
    heartbeat_timeout: float = 2.5              # seconds of silence before a worker is dead
    worker_token: str | None = None             # workers must show it; None: common.worker_token's default
    max_workers: int = 64                       # workers held per role; more are refused
    request_timeout: float = 600.0              # seconds a request may wait for its next event
    metrics_port: int = 0
    log_level: str = "info"
    api_key: str | None = None                  # Bearer key required on /v1/* when set
    snapshot_budget: int = 4 << 30              # bytes of snapshots kept in RAM; 0 turns the cache off
    snapshot_dir: str | None = None             # disk tier that survives a restart
    snapshot_every: int = 1024                  # prefill checkpoints, a multiple of the 64-token chunk
    preserve_thinking: bool = True              # render past reasoning as generated, so turns share a prefix
    drain_timeout: float = 30.0                 # seconds in-flight requests get after SIGTERM
    max_body_bytes: int = 8 << 20               # larger request bodies get 413
