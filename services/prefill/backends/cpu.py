"""The `cpu` prefill backend, for machines without a usable GPU: the CPU runner's chunked
prefill (native/cpu: each weight read once per chunk of prompt tokens, by the decode kernels),
or, where the native kernels do not load, the reference model's (numpy/BLAS over weights
dequantized layer by layer)."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from common.engines import load_runner
from common.model.gguf_file import GGUFModel
from common.reference.multimodal import MropeInput
from common.state import Checkpoint, SequenceState


class CPUBackend:
    name = "cpu"

    def __init__(self, model: GGUFModel, *, chunk: int | None = None, runner: str = "auto", kv_type: str = "f32"):
        self.runner_name, self.runner = load_runner(runner, model, kv_type=kv_type)
        self.kv_type = kv_type
        self.chunk = chunk
        # every call reads each trunk weight once (embedding rows and MTP blocks aside)
        trunk = tuple(f"blk.{i}." for i in range(model.config.n_layers))
        read = [t for name, t in model.tensors.items() if name != "token_embd.weight"
                and (not name.startswith("blk.") or name.startswith(trunk))]
        self._bytes_per_call = sum(t.nbytes for t in read)
        # passes: reads of every weight (native: one per chunk; the reference: one per call)
        self._stats = {"weight_bytes": 0, "passes": 0, "compute_seconds": 0.0, "calls": 0, "tokens": 0}

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return True, "native engine, or numpy where it does not load"

    def prefill(self, tokens: list[int], state: SequenceState, *, all_logits: bool = False,
                mm: MropeInput | None = None) -> np.ndarray:
        """`mm`: the image rows and mRoPE positions of a prompt with images (multimodal.py)."""
        t0 = time.perf_counter()
        logits = self.runner.prefill(tokens, state, all_logits=all_logits, mm=mm, **self._chunk())
        self._count(len(tokens), t0)
        return logits

    def prefill_with_checkpoints(self, tokens: list[int], state: SequenceState, checkpoints: list[int], *,
                                 mm: MropeInput | None = None,
                                 progress: Callable[[], None] | None = None) -> tuple[np.ndarray, list[Checkpoint]]:
        """prefill, and the Checkpoint at each of `checkpoints` (positions strictly inside the call,
        increasing) from the same pass over the weights; `progress()` after each chunk (native) or
        layer (reference)."""
        t0 = time.perf_counter()
        out = self.runner.prefill_with_checkpoints(tokens, state, checkpoints, mm=mm, progress=progress,
                                                   **self._chunk())
        self._count(len(tokens), t0)
        return out

    def _chunk(self) -> dict:
        return {"chunk": self.chunk} if self.chunk else {}   # else the runner's own

    def _count(self, tokens: int, t0: float) -> None:
        self._stats["compute_seconds"] += time.perf_counter() - t0
        native = self.runner_name == "native"
        # the native runner counts what it read (per chunk: the dense weights, the routed experts)
        self._stats["weight_bytes"] += self.runner.last_bytes if native else self._bytes_per_call
        self._stats["passes"] += self.runner.last_chunks if native else 1
        self._stats["calls"] += 1
        self._stats["tokens"] += tokens

    def stats(self) -> dict:
        return dict(self._stats)
