"""The router process: tokenizer and chat template, worker dispatch, the HTTP API on uvicorn."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from common.metrics import RouterMetrics
from common.model.chat_template import render_chat
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer

from .admission import Admission
from .api import API
from .auth import api_key_middleware
from .config import RouterConfig
from .dispatch import Dispatcher, PrefixCache
from .generation import Generation
from .snapshots import build_snapshot_cache

log = logging.getLogger("fermium.router")

def build_router(cfg: RouterConfig, cache: PrefixCache | None = None) -> tuple[Starlette, Dispatcher]:
    """The ASGI app and its dispatcher; the dispatcher starts and stops with the app."""
    model = GGUFModel(cfg.model)
    tokenizer = Tokenizer.from_gguf(model)
    template = model.get("tokenizer.chat_template") if model.has("tokenizer.chat_template") else None
    context = min(cfg.max_model_len or model.config.context_length, model.config.context_length)
    metrics = RouterMetrics()
    if cache is None:
        cache = build_snapshot_cache(model.config, metrics, cfg.snapshot_budget, cfg.snapshot_dir,
                                     cfg.snapshot_every)
    dispatcher = Dispatcher(cfg.workers, heartbeat_timeout=cfg.heartbeat_timeout, metrics=metrics, cache=cache)
    generation = Generation(tokenizer, dispatcher, Admission(cfg.max_running, cfg.max_queue), metrics,
                            cfg.request_timeout)

    def render(messages: list[dict], kwargs: dict) -> str:
        extra = dict(kwargs)
        extra.setdefault("preserve_thinking", cfg.preserve_thinking)
        thinking = bool(extra.pop("enable_thinking", True))
        return render_chat(messages, template=template, enable_thinking=thinking, template_kwargs=extra)

    def health() -> dict:
        return {"prefill_workers": dispatcher.registry.count("prefill"),
                "decode_workers": dispatcher.registry.count("decode"),
                "running": generation.admission.running, "waiting": generation.admission.waiting,
                "workers": [{"id": w.worker_id, "role": w.role, "address": w.address, "inflight": len(w.inflight)}
                            for w in dispatcher.registry.workers.values()]}

    served = (cfg.served_model_name, Path(cfg.model).stem)   # the file's stem is accepted too
    api = API(generation, served=served, context=context,
              vocab=tokenizer.vocab_size, encode=tokenizer.encode, render=render, health=health)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await dispatcher.start()
        metrics.serve(cfg.metrics_port)
        yield
        await dispatcher.close()

    return Starlette(routes=api.routes(), lifespan=lifespan,
                     middleware=api_key_middleware(cfg.api_key)), dispatcher


def serve(cfg: RouterConfig) -> None:
    app, _ = build_router(cfg)
    log.info("router: serving %s on http://%s:%d", cfg.model, cfg.host, cfg.port)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=2)
