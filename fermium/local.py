"""The whole stack in one process: the router's Dispatcher, and a real PrefillServer and
DecodeServer on threads, over common.mp_local's in-process queues. It is the in-process twin of
fermium.stack, as vLLM's in-process client runs the real engine core: what runs is the
servers' own code, from the Hello handshake to the Finished message, without sockets.

`LocalDispatcher(runner)` is a Dispatcher (the same submit / cancel / forget, the same reply
messages). `start()`, on the event loop the API runs on (the app's lifespan), starts the
workers and waits for their handshake; `close()` stops them. The runner is handed in, so
nothing is loaded here: anything with the reference model's prefill / decode and a `.cfg`
ModelConfig (the state shapes the servers check). Prefill and decode each call theirs from
their own thread: `prefill_runner` gives prefill another one. The runners' `kv_type` (f32 where
they have none) is the --kv-type of the router and both workers. `tokenizer` is the vocabulary
decode builds grammars on (structured output, tool_choice); without one, a grammar is refused.
`decode_settings` are more DecodeConfig settings (speculative decoding's, for one). `mmproj` is
prefill's vision tower (--mmproj): the router's side of images is the API's (services/router/frontend/vision.py).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

from common.kv_cache import check_same_kv_type
from common.metrics import RouterMetrics
from common.model.config import ModelConfig
from common.state import Checkpoint, checkpoint_marks, wire_limits
from common.worker_token import new_token
from services.decode.config import DecodeConfig
from services.decode.server import DecodeServer
from services.prefill.config import PrefillConfig
from services.prefill.server import PrefillServer
from services.prefill.vision import segment
from services.router.engine.dispatch import Dispatcher, PrefixCache

READY_TIMEOUT_S = 10.0
HEARTBEAT_TIMEOUT_S = 30.0   # threads of one process: a missed heartbeat is a stall, not a death
JOIN_S = 5.0

_ids = itertools.count()


@dataclass(frozen=True)
class LoadedModel:
    """What the servers read of a GGUFModel, for a runner loaded elsewhere."""

    config: ModelConfig
    path: Path


def runner_kv_type(runner) -> str:
    return getattr(runner, "kv_type", "f32")


class RunnerBackend:
    """A prefill backend over a handed-in runner."""

    name = "runner"

    def __init__(self, runner):
        self.runner = runner
        self.kv_type = runner_kv_type(runner)

    def prefill(self, tokens, state, *, all_logits: bool = False, mm=None):
        extra = {"mm": mm} if mm is not None else {}      # runners without images keep their signature
        if all_logits:
            return self.runner.prefill(tokens, state, all_logits=True, **extra)
        return self.runner.prefill(tokens, state, **extra)

    def prefill_with_checkpoints(self, tokens, state, checkpoints, *, mm=None, progress=None):
        """The runner's own where it has one; else a prefill call per piece between checkpoints
        (a pass over the weights each), the recurrent state copied at each."""
        if hasattr(self.runner, "prefill_with_checkpoints"):
            extra = {"mm": mm} if mm is not None else {}
            return self.runner.prefill_with_checkpoints(tokens, state, checkpoints, progress=progress, **extra)
        caught, done = [], 0
        for m in [*checkpoint_marks(checkpoints, state.pos, len(tokens)), len(tokens)]:
            logits = self.prefill(list(tokens[done:m]), state, mm=None if mm is None else segment(mm, done, m))
            if progress is not None:
                progress()
            if m < len(tokens):
                caught.append(Checkpoint(state.pos, [c.copy() for c in state.conv], [a.copy() for a in state.ssm],
                                         logits))
            done = m
        return logits, caught

    def stats(self) -> dict:
        return {}


class LocalDispatcher(Dispatcher):
    def __init__(self, runner, *, cfg: ModelConfig | None = None, prefill_runner=None,
                 cache: PrefixCache | None = None, metrics: RouterMetrics | None = None, name: str = "local",
                 tokenizer=None, decode_settings: dict | None = None, mmproj: str | None = None):
        n = next(_ids)
        self.model = LoadedModel(cfg if cfg is not None else runner.cfg, Path(name))
        self.runners = (prefill_runner if prefill_runner is not None else runner, runner)
        self.tokenizer = tokenizer
        self.decode_settings = decode_settings or {}
        self.mmproj = mmproj
        kv_type = runner_kv_type(runner)
        check_same_kv_type(runner_kv_type(self.runners[0]), kv_type, "the prefill runner", "the decode runner")
        self._names = (f"local://{name}-prefill-{n}", f"local://{name}-decode-{n}")
        super().__init__(f"local://{name}-router-{n}", heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
                         metrics=metrics or RouterMetrics(), cache=cache, token=new_token(),
                         limits=wire_limits(self.model.config), kv_type=kv_type)
        self.servers: list = []
        self._threads: list[threading.Thread] = []

    async def start(self) -> None:
        await super().start()
        link = dict(router=self.address, worker_token=self.token, kv_type=self.kv_type)
        prefill_runner, decode_runner = self.runners
        self.servers = [
            PrefillServer(PrefillConfig(model=str(self.model.path), listen=self._names[0], mmproj=self.mmproj, **link),
                          model=self.model, backend=RunnerBackend(prefill_runner)),
            DecodeServer(DecodeConfig(model=str(self.model.path), listen=self._names[1], **link,
                                      **self.decode_settings),
                         model=self.model, runner=decode_runner, tokenizer=self.tokenizer)]
        for server in self.servers:
            thread = threading.Thread(target=self._serve, args=(server,), daemon=True,
                                      name=f"local-{server.link.role}")
            thread.start()
            self._threads.append(thread)
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_S
        while not (self.registry.count("prefill") and self.registry.count("decode")):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the in-process workers did not register within {READY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.005)

    @staticmethod
    def _serve(server) -> None:
        try:
            server.start()
            server.serve_forever()
        finally:
            server.close()

    async def close(self) -> None:
        """The router's side first, so that the workers' going is not taken for a death."""
        for server in self.servers:
            server.stop()
        await super().close()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, JOIN_S)
        self._threads.clear()
