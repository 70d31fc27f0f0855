"""An ASGI app served by uvicorn on loopback in a thread, for the tests that speak HTTP to a router."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import uvicorn

from fermium.stack import free_port

START_TIMEOUT_S = 10.0


@contextlib.contextmanager
def serve_app(app) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL, http://127.0.0.1:PORT."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
