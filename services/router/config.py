"""Router configuration: the settings of its engine (engine/) and of its HTTP frontends (frontend/)."""
from __future__ import annotations

from dataclasses import dataclass

from common.config import (
    GIB,
    ROUTER_WORKERS,
    ctx_size_setting,
    kv_type_setting,
    log_level_setting,
    metrics_port_setting,
    mmproj_setting,
    model_setting,
    setting,
    worker_token_setting,
)

from .engine.copies import MAX_CHOICES
from .engine.generation import REQUEST_TIMEOUT_S
from .engine.workers import MAX_PER_ROLE
from .frontend.structured import GRAMMAR_FIRST_MASK_MS


@dataclass(frozen=True)
class RouterConfig:
    model: str = model_setting()                # tokenizer, chat template, context length
    host: str = setting("127.0.0.1", "HTTP address to listen on.")
    port: int = setting(8000, "HTTP port of the router.")
    workers: str = setting(ROUTER_WORKERS, "ZeroMQ address workers register at (bind).")
    served_model_name: str = setting("fermium", "The `model` clients ask for.")   # the file stem works too
    ctx_size: int = ctx_size_setting()         # prompt + max_tokens beyond it: 400 context_length_exceeded
    kv_type: str = kv_type_setting()           # snapshots keep KV in it; workers of another type are refused
    max_running: int = setting(64, "Sequences at the workers at once; a request of `n` choices takes n.")
    max_queue: int = setting(256, "Requests waiting for a slot; beyond, 429.")
    max_n: int = setting(MAX_CHOICES, "Largest `n` (choices) a request may ask for; each choice is a sequence "
                                      "that decode holds. More: 400.", min=1)
    heartbeat_timeout: float = setting(2.5, "Seconds before a silent worker is dead.")
    stall_timeout: float = setting(60.0, "Seconds a worker with work may go without its compute loop advancing "
                                         "(one decode step, or one prefill segment of --snapshot-every tokens, "
                                         "must take less); then it is reported stalled, its requests fail with "
                                         "a retryable 503 and it exits for its supervisor to restart it. 0 "
                                         "turns this off.", min=0.0)
    worker_token: str | None = worker_token_setting()
    max_workers: int = setting(MAX_PER_ROLE, "Workers admitted per role; more are refused.", min=1)
    request_timeout: float = setting(REQUEST_TIMEOUT_S, "Seconds a request may wait for its next token.")
    send_timeout: float = setting(30.0, "Seconds a response may wait on a client that takes none of its bytes; "
                                        "then the client is dropped and its request ended.", min=0.1)
    header_timeout: float = setting(10.0, "Seconds a request's headers may take to arrive; then 408 and the "
                                          "connection closes.", min=0.1)
    body_timeout: float = setting(60.0, "Seconds a request body may take to arrive in full after its headers; "
                                        "then 408, the connection closes and the body read so far is freed.",
                                  min=0.1)
    keep_alive_timeout: float = setting(5.0, "Seconds an idle keep-alive connection stays open.", min=0.1)
    api_key: str | None = setting(None, "Require `Authorization: Bearer KEY` on /v1/*.")
    snapshot_budget: int = setting(4 << 30, "GiB of RAM for snapshots; 0 turns them off.", unit=GIB)   # bytes
    snapshot_dir: str | None = setting(None, "Disk tier for snapshots; survives restarts.", path=True)
    snapshot_disk_budget: int = setting(20 << 30, "GiB of disk for --snapshot-dir's files; the least recently "
                                                  "used go first; 0: no bound.", unit=GIB)   # bytes
    snapshot_store: str | None = setting(None, "Shared snapshot tier, redis://HOST:PORT/DB (Redis or Valkey): the "
                                               "routers that name one store see each other's snapshots.")
    snapshot_store_ca: str | None = setting(None, "CA file that a rediss:// --snapshot-store's certificate must "
                                                  "chain to.", path=True)
    snapshot_store_cert: str | None = setting(None, "Client certificate and its key (one PEM file) for a rediss:// "
                                                    "--snapshot-store that asks for one.", path=True)
    snapshot_key: str | None = setting(None, "Secret that signs the shared tier's entries (a keyed MAC), the same on "
                                             "every router of one store; entries that fail it are dropped. "
                                             "Default: derived from the worker token.")
    snapshot_every: int = setting(1024, "Prefill checkpoint interval, a multiple of 64; 0: only at prompt "
                                        "and generation ends.")
    mmproj: str | None = mmproj_setting()      # image parts are sized and expanded to image tokens here
    allow_image_urls: bool = setting(False, "Fetch http(s) image URLs of image_url parts; without it only data: "
                                            "URIs are read.")
    parse_special_in_messages: bool = setting(False, "Read control-token strings (<|im_start|>, ...) in messages, "
                                                     "tools and system text as control tokens, as before; without "
                                                     "it only the chat template places them.")
    preserve_thinking: bool = setting(True, "Render earlier reasoning as generated, so each chat turn extends "
                                            "the last one's snapshot.")
    grammar_first_mask_ms: float = setting(GRAMMAR_FIRST_MASK_MS, "Most CPU milliseconds a request's grammar "
                                           "(response_format, a forced tool call) may take for its first mask, "
                                           "timed at validation; beyond, 400. 0 turns the check off.", min=0)
    drain_timeout: float = setting(30.0, "Seconds in-flight requests get to finish after SIGTERM; new ones "
                                         "get 503 meanwhile.")
    metrics_port: int = metrics_port_setting()
    metrics_host: str | None = setting(None, "Address /metrics listens on; default: --host.")
    log_level: str = log_level_setting()
    max_body_bytes: int = 8 << 20               # larger request bodies get 413; a 262k-token context as text is ~1 MB
