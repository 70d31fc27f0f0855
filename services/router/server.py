"""The router process: the model's tokenizer and chat template, the engine (engine/), the HTTP API
in front of it (frontend/), on uvicorn.

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
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from common.config import context_size
from common.kv_cache import check_kv_type
from common.metrics import RouterMetrics
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from common.model.template_tokens import TemplateTokens
from common.model.tokenizer import Tokenizer
from common.state import wire_limits

from .config import RouterConfig
from .engine import Engine
from .engine.admission import Admission
from .engine.dispatch import Dispatcher
from .engine.prefix_cache import PrefixCache, build_snapshot_cache
from .engine.shared_store import shared_cache, store_key
from .frontend.api import API
from .frontend.auth import api_key_middleware
from .frontend.connections import http_options
from .frontend.exposure import check_api_key, metrics_route
from .frontend.structured import warm
from .frontend.template import chat_renderer
from .frontend.vision import VisionInput

log = logging.getLogger("fermium.router")

EXIT_GRACE_S = 1.0          # uvicorn's wait for connections after the drain, which left none busy


def build_router(cfg: RouterConfig, cache: PrefixCache | None = None) -> tuple[Starlette, Engine]:
    """The ASGI app and its engine; the engine starts and stops with the app."""
    app, api = _build(cfg, cache)
    return app, api.engine


def build_engine(cfg: RouterConfig, model: GGUFModel, tokenizer, context: int, kv_type: str,
                 cache: PrefixCache | None = None) -> Engine:
    """The engine of `cfg`'s settings: its snapshot cache (unless `cache` is given), dispatcher and
    admission, for `model` at `context` tokens, its KV kept in `kv_type`."""
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
    return Engine(tokenizer, dispatcher, Admission(cfg.max_running, cfg.max_queue), metrics, cfg.request_timeout)


def _build(cfg: RouterConfig, cache: PrefixCache | None) -> tuple[Starlette, API]:
    model = GGUFModel(cfg.model)
    tokenizer = Tokenizer.from_gguf(model)
    template = model.get("tokenizer.chat_template") if model.has("tokenizer.chat_template") else None
    context = context_size(cfg.ctx_size, model.config)      # beyond the model's: refused at start
    kv_type = check_kv_type(cfg.kv_type, model.config.head_dim)
    engine = build_engine(cfg, model, tokenizer, context, kv_type, cache)
    served = (cfg.served_model_name, Path(cfg.model).stem)   # the file's stem is accepted too
    api = API(engine, served=served, context=context,
              vocab=tokenizer.vocab_size, encode=functools.partial(tokenizer.encode, limit=context),
              decode=tokenizer.decode,
              render=chat_renderer(template, cfg.preserve_thinking),
              max_body=cfg.max_body_bytes, max_n=cfg.max_n, tokenizer=tokenizer,
              vision=_vision(cfg, model, tokenizer),
              template=TemplateTokens(tokenizer, parse_special=cfg.parse_special_in_messages))
    warm(tokenizer, cfg.grammar_first_mask_ms / 1000)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await engine.start()
        engine.metrics.serve(cfg.metrics_port, cfg.metrics_host or cfg.host)
        yield
        await engine.close()

    app = api.app(lifespan=lifespan, middleware=api_key_middleware(cfg.api_key),
                  extra=[metrics_route(engine.metrics.registry)])
    return app, api


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
    app, api = _build(cfg, None)
    log.info("router: serving %s on http://%s:%d", cfg.model, cfg.host, cfg.port)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                            timeout_graceful_shutdown=EXIT_GRACE_S, **http_options(cfg, api.engine.metrics))
    DrainingServer(config, api, cfg.drain_timeout).run()
