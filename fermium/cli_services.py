"""`fermium router | prefill | decode | up | chat | demo`: the services and the stack launcher.

Every option also reads a FERMIUM_* environment variable (systemd environment files)."""
from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Optional

import typer

ROUTER_WORKERS = "tcp://127.0.0.1:5560"
DEMO_QUESTION = "Who art thou, and what dost thou seek?"


def _model(path: Optional[Path]) -> str:
    if path is not None:
        return str(path)
    from common.model.default import default_model_path
    return str(default_model_path())


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _security(curve_dir: Optional[Path], insecure: bool) -> None:
    from common.security import configure
    try:
        configure(curve_dir, insecure)
    except (OSError, RuntimeError) as e:
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
    model: Optional[Path] = typer.Option(None, envvar="FERMIUM_MODEL", help="GGUF model (tokenizer, template, context length); default: the bundled demo model."),
    host: str = typer.Option("127.0.0.1", envvar="FERMIUM_HOST", help="HTTP address to listen on."),
    port: int = typer.Option(8000, envvar="FERMIUM_PORT", help="HTTP port."),
    workers: str = typer.Option(ROUTER_WORKERS, envvar="FERMIUM_WORKERS", help="ZeroMQ address workers register at (bind)."),
    served_model_name: str = typer.Option("fermium", envvar="FERMIUM_SERVED_MODEL_NAME", help="The `model` clients ask for."),
    max_model_len: int = typer.Option(0, envvar="FERMIUM_MAX_MODEL_LEN", help="Context limit; 0 is the model's."),
    max_running: int = typer.Option(64, envvar="FERMIUM_MAX_RUNNING", help="Requests at the workers at once."),
    max_queue: int = typer.Option(256, envvar="FERMIUM_MAX_QUEUE", help="Requests waiting; beyond, 429."),
    heartbeat_timeout: float = typer.Option(2.5, envvar="FERMIUM_HEARTBEAT_TIMEOUT", help="Seconds before a silent worker is dead."),
    metrics_port: int = typer.Option(0, envvar="FERMIUM_METRICS_PORT", help="Prometheus /metrics port; 0 is off."),
    log_level: str = typer.Option("info", envvar="FERMIUM_LOG_LEVEL"),
    curve_dir: Optional[Path] = typer.Option(None, envvar="FERMIUM_CURVE_DIR", help="CURVE key directory (`fermium keys create`): ZeroMQ encrypted, clients allow-listed."),
    insecure: bool = typer.Option(False, envvar="FERMIUM_INSECURE", help="Allow plaintext ZeroMQ on non-loopback addresses."),
    api_key: Optional[str] = typer.Option(None, envvar="FERMIUM_API_KEY", help="Require `Authorization: Bearer KEY` on /v1/*."),
):
    """The router: OpenAI-compatible HTTP API, admission, dispatch to workers."""
    from services.router.config import RouterConfig
    from services.router.server import serve
    _logging(log_level)
    _security(curve_dir, insecure)
    serve(RouterConfig(model=_model(model), host=host, port=port, workers=workers,
                       served_model_name=served_model_name, max_model_len=max_model_len,
                       max_running=max_running, max_queue=max_queue, heartbeat_timeout=heartbeat_timeout,
                       request_timeout=request_timeout, metrics_port=metrics_port, log_level=log_level,
                       api_key=api_key))


def prefill_command(
    model: Optional[Path] = typer.Option(None, envvar="FERMIUM_MODEL", help="GGUF model; default: the bundled demo model."),
    router: str = typer.Option(ROUTER_WORKERS, envvar="FERMIUM_ROUTER", help="The router's worker address."),
    listen: str = typer.Option("tcp://127.0.0.1:0", envvar="FERMIUM_LISTEN", help="This worker's inbox (bind); :0 picks a port."),
    advertise: Optional[str] = typer.Option(None, envvar="FERMIUM_ADVERTISE", help="Inbox address as other hosts reach it."),
    backend: str = typer.Option("cpu", envvar="FERMIUM_BACKEND", help="Prefill backend: cpu, cuda."),
    device: int = typer.Option(0, envvar="FERMIUM_DEVICE", help="GPU index (cuda backend)."),
    vram_budget: Optional[float] = typer.Option(None, envvar="FERMIUM_VRAM_BUDGET", help="GiB of GPU memory to use (cuda backend)."),
    metrics_port: int = typer.Option(0, envvar="FERMIUM_METRICS_PORT", help="Prometheus /metrics port; 0 is off."),
    ready_timeout: float = typer.Option(30.0, envvar="FERMIUM_READY_TIMEOUT", help="Seconds to wait for the router."),
    log_level: str = typer.Option("info", envvar="FERMIUM_LOG_LEVEL"),
    curve_dir: Optional[Path] = typer.Option(None, envvar="FERMIUM_CURVE_DIR", help="CURVE key directory (`fermium keys create`): ZeroMQ encrypted, clients allow-listed."),
    insecure: bool = typer.Option(False, envvar="FERMIUM_INSECURE", help="Allow plaintext ZeroMQ on non-loopback addresses."),
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
        backend_options=options, metrics_port=metrics_port, ready_timeout=ready_timeout)))


def decode_command(
    model: Optional[Path] = typer.Option(None, envvar="FERMIUM_MODEL", help="GGUF model; default: the bundled demo model."),
    router: str = typer.Option(ROUTER_WORKERS, envvar="FERMIUM_ROUTER", help="The router's worker address."),
    listen: str = typer.Option("tcp://127.0.0.1:0", envvar="FERMIUM_LISTEN", help="This worker's inbox (bind); :0 picks a port."),
    advertise: Optional[str] = typer.Option(None, envvar="FERMIUM_ADVERTISE", help="Inbox address as other hosts reach it."),
    engine: str = typer.Option("auto", envvar="FERMIUM_ENGINE", help="native, reference, or auto (native when it loads)."),
    max_batch: int = typer.Option(16, envvar="FERMIUM_MAX_BATCH", help="Sequences per decode step."),
    capacity: int = typer.Option(64, envvar="FERMIUM_CAPACITY", help="Sequences held at once."),
    metrics_port: int = typer.Option(0, envvar="FERMIUM_METRICS_PORT", help="Prometheus /metrics port; 0 is off."),
    ready_timeout: float = typer.Option(30.0, envvar="FERMIUM_READY_TIMEOUT", help="Seconds to wait for the router."),
    log_level: str = typer.Option("info", envvar="FERMIUM_LOG_LEVEL"),
    curve_dir: Optional[Path] = typer.Option(None, envvar="FERMIUM_CURVE_DIR", help="CURVE key directory (`fermium keys create`): ZeroMQ encrypted, clients allow-listed."),
    insecure: bool = typer.Option(False, envvar="FERMIUM_INSECURE", help="Allow plaintext ZeroMQ on non-loopback addresses."),
):
    """A decode worker: continuous batching, tokens streamed to the router."""
    from services.decode.config import DecodeConfig
    from services.decode.server import DecodeServer
    _logging(log_level)
    _security(curve_dir, insecure)
    _run_worker(DecodeServer(DecodeConfig(
        model=_model(model), router=router, listen=listen, advertise=advertise, engine=engine,
        max_batch=max_batch, capacity=capacity, metrics_port=metrics_port, ready_timeout=ready_timeout)))


def up_command(
    model: Optional[Path] = typer.Option(None, envvar="FERMIUM_MODEL", help="GGUF model; default: the bundled demo model."),
    port: int = typer.Option(8000, envvar="FERMIUM_PORT", help="HTTP port of the router."),
    engine: str = typer.Option("auto", envvar="FERMIUM_ENGINE", help="Decode engine: native, reference, auto."),
    backend: str = typer.Option("cpu", envvar="FERMIUM_BACKEND", help="Prefill backend: cpu, cuda."),
    metrics_port: int = typer.Option(0, envvar="FERMIUM_METRICS_PORT", help="First of three /metrics ports (router, prefill, decode); 0 is off."),
    chat: Optional[str] = typer.Option(None, help="Stream the answer to this message, then stop the stack."),
    ready_timeout: float = typer.Option(120.0, help="Seconds to wait for the stack to be ready."),
    log_level: str = typer.Option("warning", envvar="FERMIUM_LOG_LEVEL", help="Log level of the three services."),
):
    """Start router, prefill and decode on loopback; Ctrl-C stops them all."""
    from fermium.stack import Stack, stream_chat
    signal.signal(signal.SIGTERM, _interrupt)   # stopped by a service manager: same clean stop as Ctrl-C
    ports = {name: metrics_port + i for i, name in enumerate(("router", "prefill", "decode"))} if metrics_port else {}
    quiet = {name: ["--log-level", log_level] for name in ("router", "prefill", "decode")}
    with Stack(_model(model), port=port, engine=engine, backend=backend, metrics_ports=ports, extra=quiet) as stack:
        stack.wait_ready(ready_timeout)
        if chat is not None:
            stream_chat(stack.url, chat)
            return
        print(f"Fermium is up at {stack.url}\n\n  curl -N {stack.url}/v1/chat/completions "
              "-H 'content-type: application/json' \\\n    -d '{\"model\": \"fermium\", \"messages\": "
              "[{\"role\": \"user\", \"content\": \"Hello\"}], \"stream\": true}'\n\nCtrl-C stops it.", flush=True)
        stack.wait()


def chat_command(
    message: str = typer.Argument(..., help="The user message."),
    url: str = typer.Option("http://127.0.0.1:8000", envvar="FERMIUM_URL", help="The router's HTTP address."),
    max_tokens: int = typer.Option(128, min=1), temperature: float = typer.Option(0.0, min=0.0),
):
    """Stream one chat answer from a running router to the terminal."""
    from fermium.stack import stream_chat
    stream_chat(url, message, max_tokens=max_tokens, temperature=temperature)


def demo_command(port: int = typer.Option(8000, envvar="FERMIUM_PORT", help="HTTP port of the router.")):
    """Bring the stack up on the bundled demo model and stream one chat answer."""
    up_command(model=None, port=port, engine="auto", backend="cpu", metrics_port=0, chat=DEMO_QUESTION,
               ready_timeout=120.0, log_level="warning")
