"""`fermium router | prefill | decode | up | chat | demo`: the services and the stack launcher.

Every option also reads a FERMIUM_* environment variable (systemd environment files)."""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

ROUTER_WORKERS = "tcp://127.0.0.1:5560"
DEMO_QUESTION = "Who art thou, and what dost thou seek?"


def _opt(env: str, help: str, **kw) -> typer.models.OptionInfo:
    return typer.Option(envvar=f"FERMIUM_{env}", help=help, **kw)


# options shared by several commands
Model = Annotated[Optional[Path], _opt("MODEL", "GGUF model file; default: the bundled demo model.")]
MetricsPort = Annotated[int, _opt("METRICS_PORT", "Prometheus /metrics port; 0 is off.")]
LogLevel = Annotated[str, _opt("LOG_LEVEL", "debug, info, warning or error.")]
CurveDir = Annotated[Optional[Path], _opt("CURVE_DIR", "CURVE key directory (`fermium keys create`): "
                                                      "ZeroMQ encrypted, clients allow-listed.")]
Insecure = Annotated[bool, _opt("INSECURE", "Allow plaintext ZeroMQ on non-loopback addresses.")]
Router = Annotated[str, _opt("ROUTER", "The router's worker address.")]
Listen = Annotated[str, _opt("LISTEN", "This worker's inbox (bind); :0 picks a free port.")]
Advertise = Annotated[Optional[str], _opt("ADVERTISE", "Inbox address as other hosts reach it.")]
ReadyTimeout = Annotated[float, _opt("READY_TIMEOUT", "Seconds to wait for the router's handshake.")]
Port = Annotated[int, _opt("PORT", "HTTP port of the router.")]
RUNNER_FLAGS = ("--runner", "--engine")   # --engine: the flag's name before runners were named
Runner = Annotated[str, typer.Option(*RUNNER_FLAGS, envvar=["FERMIUM_RUNNER", "FERMIUM_ENGINE"],
                                     help="Decode runner: native, reference, or auto (native when it loads).")]
WorkerToken = Annotated[Optional[str], _opt("WORKER_TOKEN", "Secret that admits workers, the same on router, "
                                                            "prefill and decode; default: a token file in this "
                                                            "user's state directory (one host).")]


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


def _security(curve_dir: Optional[Path], insecure: bool) -> None:
    from common.security import configure
    try:
        configure(curve_dir, insecure)
    except (OSError, RuntimeError) as e:
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]


def _token(given: Optional[str]) -> str:
    from common.worker_token import resolve
    try:
        return resolve(given)
    except OSError as e:
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _run_worker(server) -> None:
    """Handshake, then the compute loop until SIGTERM or Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    try:
        server.start()
    except (TimeoutError, RuntimeError, OSError) as e:
        server.close()
        raise typer.Exit(f"error: {e}") from None  # type: ignore[arg-type]
    try:
        server.serve_forever()
    finally:
        server.close()


def router_command(
    model: Model = None,
    host: Annotated[str, _opt("HOST", "HTTP address to listen on.")] = "127.0.0.1",
    port: Port = 8000,
    workers: Annotated[str, _opt("WORKERS", "ZeroMQ address workers register at (bind).")] = ROUTER_WORKERS,
    served_model_name: Annotated[str, _opt("SERVED_MODEL_NAME", "The `model` clients ask for.")] = "fermium",
    max_model_len: Annotated[int, _opt("MAX_MODEL_LEN", "Context limit; 0 is the model's.")] = 0,
    max_running: Annotated[int, _opt("MAX_RUNNING", "Requests at the workers at once.")] = 64,
    max_queue: Annotated[int, _opt("MAX_QUEUE", "Requests waiting for a slot; beyond, 429.")] = 256,
    heartbeat_timeout: Annotated[float, _opt("HEARTBEAT_TIMEOUT", "Seconds before a silent worker is dead.")] = 2.5,
    worker_token: WorkerToken = None,
    max_workers: Annotated[int, _opt("MAX_WORKERS", "Workers admitted per role; more are refused.", min=1)] = 64,
    request_timeout: Annotated[float, _opt("REQUEST_TIMEOUT", "Seconds a request may wait for its next token.")] = 600.0,
    api_key: Annotated[Optional[str], _opt("API_KEY", "Require `Authorization: Bearer KEY` on /v1/*.")] = None,
    snapshot_budget: Annotated[float, _opt("SNAPSHOT_BUDGET", "GiB of RAM for snapshots; 0 turns them off.")] = 4.0,
    snapshot_dir: Annotated[Optional[Path], _opt("SNAPSHOT_DIR", "Disk tier for snapshots; survives restarts.")] = None,
    snapshot_every: Annotated[int, _opt("SNAPSHOT_EVERY", "Prefill checkpoint interval, a multiple of 64; "
                                                          "0: only at prompt and generation ends.")] = 1024,
    preserve_thinking: Annotated[bool, _opt("PRESERVE_THINKING", "Render earlier reasoning as generated, so "
                                                                "each chat turn extends the last one's snapshot.")] = True,
    drain_timeout: Annotated[float, _opt("DRAIN_TIMEOUT", "Seconds in-flight requests get to finish after "
                                                          "SIGTERM; new ones get 503 meanwhile.")] = 30.0,
    metrics_port: MetricsPort = 0, log_level: LogLevel = "info",
    curve_dir: CurveDir = None, insecure: Insecure = False,
):
    """The router: OpenAI-compatible HTTP API, admission, dispatch to workers, snapshot cache."""
    from services.router.config import RouterConfig
    from services.router.server import serve
    _logging(log_level)
    _security(curve_dir, insecure)
    serve(RouterConfig(model=_model(model), host=host, port=port, workers=workers,
                       served_model_name=served_model_name, max_model_len=max_model_len,
                       max_running=max_running, max_queue=max_queue, heartbeat_timeout=heartbeat_timeout,
                       worker_token=_token(worker_token), max_workers=max_workers,
                       request_timeout=request_timeout, metrics_port=metrics_port, log_level=log_level,
                       api_key=api_key, snapshot_budget=int(snapshot_budget * 2 ** 30),
                       snapshot_dir=str(snapshot_dir) if snapshot_dir else None, snapshot_every=snapshot_every,
                       preserve_thinking=preserve_thinking, drain_timeout=drain_timeout))


def prefill_command(
    model: Model = None, router: Router = ROUTER_WORKERS, listen: Listen = "tcp://127.0.0.1:0",
    advertise: Advertise = None,
    backend: Annotated[str, _opt("BACKEND", "Prefill backend: cpu, cuda.")] = "cpu",
    device: Annotated[int, _opt("DEVICE", "GPU index (cuda backend).")] = 0,
    vram_budget: Annotated[Optional[float], _opt("VRAM_BUDGET", "GiB of GPU memory to use (cuda backend).")] = None,
    worker_token: WorkerToken = None,
    ready_timeout: ReadyTimeout = 30.0, metrics_port: MetricsPort = 0, log_level: LogLevel = "info",
    curve_dir: CurveDir = None, insecure: Insecure = False,
):
    """A prefill worker: runs prompts and ships the state to a decode worker."""
    from services.prefill.config import PrefillConfig
    from services.prefill.server import PrefillServer
    _logging(log_level)
    _security(curve_dir, insecure)
    options = {"device": device, **({"vram_budget": int(vram_budget * 2**30)} if vram_budget else {})} \
        if backend == "cuda" else {}
    _run_worker(PrefillServer(PrefillConfig(
        model=_model(model), router=router, listen=listen, advertise=advertise, backend=backend,
        backend_options=options, metrics_port=metrics_port, ready_timeout=ready_timeout,
        worker_token=_token(worker_token))))


def decode_command(
    model: Model = None, router: Router = ROUTER_WORKERS, listen: Listen = "tcp://127.0.0.1:0",
    advertise: Advertise = None,
    runner: Runner = "auto",
    max_batch: Annotated[int, _opt("MAX_BATCH", "Sequences per decode step.")] = 16,
    capacity: Annotated[int, _opt("CAPACITY", "Sequences held at once.")] = 64,
    worker_token: WorkerToken = None,
    ready_timeout: ReadyTimeout = 30.0, metrics_port: MetricsPort = 0, log_level: LogLevel = "info",
    curve_dir: CurveDir = None, insecure: Insecure = False,
):
    """A decode worker: continuous batching, tokens streamed to the router."""
    from services.decode.config import DecodeConfig
    from services.decode.server import DecodeServer
    _logging(log_level)
    _security(curve_dir, insecure)
    _run_worker(DecodeServer(DecodeConfig(
        model=_model(model), router=router, listen=listen, advertise=advertise, runner=runner,
        max_batch=max_batch, capacity=capacity, metrics_port=metrics_port, ready_timeout=ready_timeout,
        worker_token=_token(worker_token))))


def up_command(
    model: Model = None, port: Port = 8000,
    runner: Runner = "auto",
    backend: Annotated[str, _opt("BACKEND", "Prefill backend: cpu, cuda.")] = "cpu",
    metrics_port: Annotated[int, _opt("METRICS_PORT", "First of three /metrics ports "
                                                      "(router, prefill, decode); 0 is off.")] = 0,
    chat: Annotated[Optional[str], typer.Option(help="Stream the answer to this message, then stop.")] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for the stack to be ready.")] = 120.0,
    drain_timeout: Annotated[float, _opt("DRAIN_TIMEOUT", "Seconds in-flight requests get to finish on "
                                                          "SIGTERM or Ctrl-C (a second one stops at once).",
                                         min=0.0)] = 30.0,
    log_level: LogLevel = "warning",
):
    """Start router, prefill and decode on loopback, restarting any that dies; Ctrl-C stops them all."""
    from fermium.stack import Stack, stream_chat
    from fermium.supervisor import Supervisor
    signal.signal(signal.SIGTERM, _interrupt)   # while starting: the same clean stop as Ctrl-C
    # Ctrl-C stops it even when started from a shell that ignores SIGINT (a background job
    # inherits it ignored, and Python then installs no handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    roles = ("router", "prefill", "decode")
    ports = {name: metrics_port + i for i, name in enumerate(roles)} if metrics_port else {}
    quiet = {name: ["--log-level", log_level] for name in roles}
    path = _model(model)
    note = lambda text: print(text, file=sys.stderr, flush=True)     # progress; stdout carries the answer
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


def chat_command(
    message: Annotated[str, typer.Argument(help="The user message.")],
    url: Annotated[str, _opt("URL", "The router's HTTP address.")] = "http://127.0.0.1:8000",
    max_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.0,
):
    """Stream one chat answer from a running router to the terminal."""
    from fermium.stack import stream_chat
    stream_chat(url, message, max_tokens=max_tokens, temperature=temperature)


def demo_command(port: Port = 8000):
    """Bring the stack up on the bundled demo model and stream one chat answer."""
    up_command(model=None, port=port, runner="auto", backend="cpu", metrics_port=0, chat=DEMO_QUESTION,
               ready_timeout=120.0, drain_timeout=30.0, log_level="warning")
