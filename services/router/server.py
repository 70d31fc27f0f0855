"""The router process: tokenizer and chat template, worker dispatch, the HTTP API on uvicorn.

The first SIGTERM (or SIGINT) drains: the listening socket stays open and answers 503 while
the requests under way get `drain_timeout` seconds, and then the process exits. A second
signal exits at once, as plain uvicorn does.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from pathlib import Path
from typing import Callable

import uvicorn
from starlette.applications import Starlette

from common.config import context_size
from common.kv_cache import check_kv_type
from common.metrics import RouterMetrics
from common.model.chat_template import render_chat
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from common.model.template_tokens import TemplateTokens
from common.model.tokenizer import Tokenizer
from common.state import wire_limits

from .admission import Admission
from .api import API
from .auth import api_key_middleware
from .config import RouterConfig
from .connections import http_options
from .dispatch import Dispatcher, PrefixCache
from .exposure import check_api_key, metrics_route
from .generation import Generation
from .prefix_cache import build_snapshot_cache
from .shared_store import shared_cache, store_key
from .structured import warm
from .vision import VisionInput
from .workers import ROLES

log = logging.getLogger("fermium.router")

EXIT_GRACE_S = 1.0          # uvicorn's wait for connections after the drain, which left none busy


def chat_renderer(template: str | None, preserve_thinking: bool) -> Callable[[list[dict], dict], str]:
    """The API's render(messages, variables): `enable_thinking` and `tools` among the variables are
    render_chat's arguments, the rest template variables; `preserve_thinking` is the router's default."""
    def render(messages: list[dict], variables: dict) -> str:
        extra = dict(variables)
        extra.setdefault("preserve_thinking", preserve_thinking)
        thinking = bool(extra.pop("enable_thinking", True))
        tools = extra.pop("tools", None)
        return render_chat(messages, template=template, enable_thinking=thinking, tools=tools,
                           template_kwargs=extra)
    return render


def build_router(cfg: RouterConfig, cache: PrefixCache | None = None) -> tuple[Starlette, Dispatcher]:
    """The ASGI app and its dispatcher; the dispatcher starts and stops with the app."""
    app, dispatcher, _ = _build(cfg, cache)
    return app, dispatcher


def _build(cfg: RouterConfig, cache: PrefixCache | None) -> tuple[Starlette, Dispatcher, API]:
    model = GGUFModel(cfg.model)
    tokenizer = Tokenizer.from_gguf(model)
    template = model.get("tokenizer.chat_template") if model.has("tokenizer.chat_template") else None
    context = context_size(cfg.ctx_size, model.config)      # beyond the model's: refused at start
    kv_type = check_kv_type(cfg.kv_type, model.config.head_dim)
    metrics = RouterMetrics()
    if cache is None:
        cache = build_snapshot_cache(model.config, metrics, cfg.snapshot_budget, cfg.snapshot_dir,
                                     cfg.snapshot_every, model.fingerprint, kv_type, cfg.snapshot_disk_budget)
        if cache is not None and cfg.snapshot_store:
            cache = shared_cache(cache, cfg.snapshot_store, model.fingerprint, metrics,
                                 store_key(cfg.snapshot_key, cfg.worker_token), cfg.snapshot_store_ca,
                                 cfg.snapshot_store_cert)
        elif cfg.snapshot_store:
            log.warning("--snapshot-store is not used: --snapshot-budget 0 turns snapshots off")
    dispatcher = Dispatcher(cfg.workers, heartbeat_timeout=cfg.heartbeat_timeout, metrics=metrics, cache=cache,
                            token=cfg.worker_token, max_workers=cfg.max_workers, kv_type=kv_type,
                            stall_timeout=cfg.stall_timeout,
                            limits=wire_limits(dataclasses.replace(model.config, context_length=context)))
    generation = Generation(tokenizer, dispatcher, Admission(cfg.max_running, cfg.max_queue), metrics,
                            cfg.request_timeout)

    def health() -> dict:
        return {"prefill_workers": dispatcher.registry.count("prefill"),
                "decode_workers": dispatcher.registry.count("decode"),
                "running": generation.admission.running, "waiting": generation.admission.waiting,
                "workers": [{"id": w.worker_id, "role": w.role, "address": w.address, "inflight": len(w.inflight)}
                            for w in dispatcher.registry.workers.values()],
                "missing": [missing(role) for role in ROLES if not dispatcher.registry.count(role)],
                "stalled": dispatcher.liveness.report()}

    def missing(role: str) -> dict:
        """A role with no live worker, and the last one of it that died (None: none ever came)."""
        lost = dispatcher.registry.lost.get(role)
        if lost is None:
            return {"role": role, "id": None, "address": None, "reason": "no worker has registered"}
        return {"role": role, "id": lost.worker_id, "address": lost.address, "reason": lost.why,
                "seconds_ago": round(time.monotonic() - lost.at, 3)}

    served = (cfg.served_model_name, Path(cfg.model).stem)   # the file's stem is accepted too
    api = API(generation, served=served, context=context,
              vocab=tokenizer.vocab_size, encode=functools.partial(tokenizer.encode, limit=context),
              decode=tokenizer.decode,
              render=chat_renderer(template, cfg.preserve_thinking), health=health,
              max_body=cfg.max_body_bytes, max_n=cfg.max_n, tokenizer=tokenizer,
              vision=_vision(cfg, model, tokenizer),
              template=TemplateTokens(tokenizer, parse_special=cfg.parse_special_in_messages))
    warm(tokenizer, cfg.grammar_first_mask_ms / 1000)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await dispatcher.start()
        metrics.serve(cfg.metrics_port, cfg.metrics_host or cfg.host)
        yield
        await dispatcher.close()

    app = api.app(lifespan=lifespan, middleware=api_key_middleware(cfg.api_key),
                  extra=[metrics_route(metrics.registry)])
    return app, dispatcher, api


def _vision(cfg: RouterConfig, model: GGUFModel, tokenizer: Tokenizer) -> VisionInput | None:
    """The reader of image parts, with --mmproj; refused at start for a text model that cannot take them."""
    if not cfg.mmproj:
        return None
    sections, half = model.config.rope_sections, model.config.rope_dim // 2
    if len(sections) < 3 or sum(sections) != half:
        raise ModelConfigError(f"{cfg.model}: rope.dimension_sections is {list(sections)}; images need mRoPE sections "
                        f"that sum to {half} (a Qwen3.5/3.6 vision-language model)")
    try:
        vision = VisionInput.from_file(cfg.mmproj, tokenizer.token_to_id, cfg.allow_image_urls)
    except ValueError as e:
        raise ModelConfigError(f"--mmproj {cfg.mmproj}: {e}") from None
    if vision.cfg.projection_dim != model.config.hidden_size:
        raise ModelConfigError(f"--mmproj {cfg.mmproj}: the tower projects to {vision.cfg.projection_dim}, the model "
                        f"{cfg.model} is {model.config.hidden_size} wide")
    log.info("router: images through %s%s", cfg.mmproj, ", image URLs fetched" if cfg.allow_image_urls else "")
    return vision


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the API before uvicorn shuts down."""

    def __init__(self, config: uvicorn.Config, api: API, drain_timeout: float):
        super().__init__(config)
        self.api, self.drain_timeout = api, drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._draining: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._signalled or self._loop is None:
            return super().handle_exit(sig, frame)
        self._signalled = True
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        log.info("router: signal %d; draining for at most %g s (signal again to stop at once)",
                 sig, self.drain_timeout)

        async def drain() -> None:
            try:
                await self.api.drain(self.drain_timeout)
            finally:
                self.should_exit = True
        self._draining = asyncio.ensure_future(drain())


def serve(cfg: RouterConfig) -> None:
    cfg = dataclasses.replace(cfg, api_key=check_api_key(cfg.api_key))
    app, _, api = _build(cfg, None)
    log.info("router: serving %s on http://%s:%d", cfg.model, cfg.host, cfg.port)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                            timeout_graceful_shutdown=EXIT_GRACE_S, **http_options(cfg, api.gen.metrics))
    DrainingServer(config, api, cfg.drain_timeout).run()
