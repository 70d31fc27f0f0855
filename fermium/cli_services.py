"""`fermium router | prefill | decode | up | chat | demo`: the services and the stack launcher.

The services' options are their config dataclasses' settings (fermium/options.py), and `up`'s
are the same settings of the services it starts. Every option of a service also reads a
FERMIUM_* environment variable (systemd environment files)."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from common.config import WorkerConfig, default
from common.config import settings as fields_of
from fermium.options import command, config, defaults, options
from services.decode.config import DecodeConfig
from services.prefill.config import PrefillConfig
from services.router.config import RouterConfig

ROUTER_URL = f"http://{default(RouterConfig, 'host')}:{default(RouterConfig, 'port')}"

# process options: they configure this process, no service's config holds them
CurveDir = Annotated[Optional[Path], typer.Option(envvar="FERMIUM_CURVE_DIR", help="CURVE key directory (`fermium "
                                                  "keys create`): ZeroMQ encrypted, clients allow-listed.")]
Insecure = Annotated[bool, typer.Option(envvar="FERMIUM_INSECURE",
                                        help="Allow plaintext ZeroMQ on non-loopback addresses.")]


def _model(path: Optional[Path]) -> str:
    if path is not None:
        return str(path)
    from common.model.default import default_model_path
    try:
        return str(default_model_path())
    except FileNotFoundError as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _token(given: Optional[str]) -> str:
    from common.worker_token import resolve
    try:
        return resolve(given)
    except OSError as e:
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]


def _service(cls: type, settings: dict, curve_dir: Optional[Path], insecure: bool):
    """The service's config from its options; logging and ZeroMQ security set up for this process."""
    from common.kv_cache import check_kv_type
    from common.security import configure
    check_kv_type(settings["kv_type"])          # a bad name fails before the model loads
    _logging(settings["log_level"])
    try:
        configure(curve_dir, insecure)
    except (OSError, RuntimeError) as e:
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]
    return config(cls, settings, model=_model(settings["model"]), worker_token=_token(settings["worker_token"]))


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _run_worker(server) -> None:
    try:
        server.run()
    except (TimeoutError, RuntimeError, OSError) as e:
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]


def _worker_options(cls: type) -> list:
    """The router link first, then the worker's own settings, then the rest that workers share."""
    shared, link = list(fields_of(WorkerConfig)), ("model", "router", "listen", "advertise")
    own = [n for n in fields_of(cls) if n not in shared]
    return options(cls, *link, *own, *(n for n in shared if n not in link))


@command(options(RouterConfig))
def router_command(*, curve_dir: CurveDir = None, insecure: Insecure = False, **settings):
    """The router: OpenAI-compatible HTTP API, admission, dispatch to workers, snapshot cache."""
    from services.router.server import serve
    serve(_service(RouterConfig, settings, curve_dir, insecure))


@command(_worker_options(PrefillConfig))
def prefill_command(*, curve_dir: CurveDir = None, insecure: Insecure = False, **settings):
    """A prefill worker: runs prompts and ships the state to a decode worker."""
    cfg = _service(PrefillConfig, settings, curve_dir, insecure)
    from services.prefill.server import PrefillServer
    _run_worker(PrefillServer(cfg))


@command(_worker_options(DecodeConfig))
def decode_command(*, curve_dir: CurveDir = None, insecure: Insecure = False, **settings):
    """A decode worker: continuous batching, tokens streamed to the router."""
    cfg = _service(DecodeConfig, settings, curve_dir, insecure)
    from services.decode.server import DecodeServer
    _run_worker(DecodeServer(cfg))


UP_CHANGES = {"metrics_port": {"help": "First of three /metrics ports (router, prefill, decode); 0 is off."},
              "drain_timeout": {"help": "Seconds in-flight requests get to finish on SIGTERM or Ctrl-C (a second "
                                        "one stops at once).", "min": 0.0},
              "log_level": {"default": "warning"}}


@command(options(RouterConfig, "model", "port", "ctx_size", "kv_type"),
         options(DecodeConfig, "runner", "max_batch", "speculative", "draft_tokens", "draft_vocab"),
         options(PrefillConfig, "backend"),
         options(RouterConfig, "mmproj", "allow_image_urls", "snapshot_store", "snapshot_key", "stall_timeout"),
         options(RouterConfig, "metrics_port", **UP_CHANGES), "chat", "ready_timeout",
         options(RouterConfig, "drain_timeout", "log_level", **UP_CHANGES))
def up_command(
    *,
    chat: Annotated[Optional[str], typer.Option(help="Stream the answer to this message, then stop.")] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for the stack to be ready.")] = 120.0,
    **settings,
):
    """Start router, prefill and decode on loopback, restarting any that dies; Ctrl-C stops them all."""
    from common.kv_cache import check_kv_type
    from common.speculative import check_settings
    from fermium.stack import Stack, stream_chat
    from fermium.supervisor import Supervisor
    check_kv_type(settings["kv_type"])
    check_settings(settings["speculative"], settings["draft_tokens"], settings["draft_vocab"])
    signal.signal(signal.SIGTERM, _interrupt)   # while starting: the same clean stop as Ctrl-C
    # Ctrl-C stops it even when started from a shell that ignores SIGINT (a background job
    # inherits it ignored, and Python then installs no handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    port, runner, backend, drain_timeout = (settings[k] for k in ("port", "runner", "backend", "drain_timeout"))
    roles, first = ("router", "prefill", "decode"), settings["metrics_port"]
    ports = {name: first + i for i, name in enumerate(roles)} if first else {}
    quiet = {name: ["--log-level", settings["log_level"]] for name in roles}
    for name in roles:                          # one context size and KV type for all three (each checks them)
        quiet[name] += ["--ctx-size", str(settings["ctx_size"]), "--kv-type", settings["kv_type"]]
    quiet["decode"] += ["--max-batch", str(settings["max_batch"])]
    if settings["mmproj"]:                      # the router sizes images, prefill encodes them
        for name in ("router", "prefill"):
            quiet[name] += ["--mmproj", str(settings["mmproj"])]
    if settings["allow_image_urls"]:
        quiet["router"] += ["--allow-image-urls"]
    if settings["snapshot_store"]:
        quiet["router"] += ["--snapshot-store", settings["snapshot_store"]]
    if settings["snapshot_key"]:                # a secret: to the router by its environment, not its argv
        os.environ["FERMIUM_SNAPSHOT_KEY"] = settings["snapshot_key"]
    quiet["router"] += ["--stall-timeout", str(settings["stall_timeout"])]   # a stalled worker exits; restarted here
    for name in ("speculative", "draft_tokens", "draft_vocab"):
        quiet["decode"] += [f"--{name.replace('_', '-')}", str(settings[name])]
    path = _model(settings["model"])
    _check_fits(path, settings["ctx_size"], settings["kv_type"])

    def note(text):     # progress; stdout carries the answer
        print(text, file=sys.stderr, flush=True)

    note(f"starting router, prefill ({backend}) and decode ({runner}) on {path} ...")
    with Stack(path, port=port, runner=runner, backend=backend, metrics_ports=ports,
               extra=quiet, drain_timeout=drain_timeout) as stack:
        t0 = time.monotonic()
        try:
            stack.wait_ready(ready_timeout)
        except (RuntimeError, TimeoutError) as e:   # its children have said why, above or in their logs
            raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]
        note(f"ready at {stack.url} in {time.monotonic() - t0:.1f} s")
        if chat is not None:
            note(f"> {chat}")
            stream_chat(stack.url, chat)
            return
        print(f"Fermium is up at {stack.url}\n\n  curl -N {stack.url}/v1/chat/completions "
              "-H 'content-type: application/json' \\\n    -d '{\"model\": \"fermium\", \"messages\": "
              "[{\"role\": \"user\", \"content\": \"Hello\"}], \"stream\": true}'\n\nCtrl-C stops it.", flush=True)
        stopping = threading.Event()

        def stop(signum, _frame) -> None:
            if stopping.is_set():
                stack.hurry()
                return
            stopping.set()
            note(f"\nstopping ({signal.Signals(signum).name}): requests under way get {drain_timeout:g} s to finish")

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        Supervisor(stack, note).run(stopping)


def _check_fits(path: str, ctx_size: int, kv_type: str) -> None:
    """Before any process starts: the file and one sequence at the context must fit the RAM
    (the workers check it again at start), else the error names the --ctx-size or the smaller
    files that would."""
    from common.config import plan_context
    from common.model.config import ModelConfigError
    from common.model.gguf_file import GGUFModel
    try:
        model = GGUFModel(path)
        model.config            # read now: a file whose metadata is wrong is the services' to name
    except (ModelConfigError, FileNotFoundError):
        return                  # each service says why it cannot load the file
    plan_context("up", model, ctx_size, 1, batch_option=None, kv_type=kv_type)


def chat_command(
    message: Annotated[str, typer.Argument(help="The user message.")],
    url: Annotated[str, typer.Option(envvar="FERMIUM_URL", help="The router's HTTP address.")] = ROUTER_URL,
    max_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.0,
):
    """Stream one chat answer from a running router to the terminal (with FERMIUM_API_KEY's key, if set)."""
    from fermium.stack import stream_chat
    stream_chat(url, message, max_tokens=max_tokens, temperature=temperature)


@command(options(RouterConfig, "port"))
def demo_command(**settings):
    """Bring the stack up on the bundled demo model and stream a chat turn: its reasoning, a tool
    call, the tool's result and the answer."""
    from common.model.default import MODELS_DIR
    from fermium import demo
    from fermium.stack import Stack
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    up = defaults(up_command)
    path = _model(None)
    quiet = {name: ["--log-level", up["log_level"]] for name in ("router", "prefill", "decode")}
    print(f"starting router, prefill and decode on {path} ...", file=sys.stderr, flush=True)
    with Stack(path, port=settings["port"], extra=quiet, drain_timeout=up["drain_timeout"]) as stack:
        t0 = time.monotonic()
        try:
            stack.wait_ready(up["ready_timeout"])
        except (RuntimeError, TimeoutError) as e:
            raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]
        print(f"ready at {stack.url} in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        demo.run(stack.url, MODELS_DIR / "heldout_sample.txt")
