"""The `cpu` prefill backend: the reference engine's chunked prefill (numpy/BLAS over weights
dequantized layer by layer), for machines without a usable GPU."""
from __future__ import annotations

import time

import numpy as np

from common.engine.reference import ReferenceEngine
from common.model.gguf_file import GGUFModel
from common.state import SequenceState

from . import register_backend


@register_backend("cpu")
class CPUBackend:
    name = "cpu"

    def __init__(self, model: GGUFModel, *, chunk: int = 64):
        self.engine = ReferenceEngine(model)
        self.chunk = chunk
        # every call reads each trunk weight once (embedding rows and MTP blocks aside)
        trunk = tuple(f"blk.{i}." for i in range(model.config.n_layers))
        read = [t for name, t in model.tensors.items() if name != "token_embd.weight"
                and (not name.startswith("blk.") or name.startswith(trunk))]
        self._bytes_per_call = sum(t.nbytes for t in read)
        self._stats = {"weight_bytes": 0, "compute_seconds": 0.0, "calls": 0, "tokens": 0}

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return True, "numpy"

    def prefill(self, tokens: list[int], state: SequenceState, *, all_logits: bool = False) -> np.ndarray:
        t0 = time.perf_counter()
        logits = self.engine.prefill(tokens, state, chunk=self.chunk, all_logits=all_logits)
        self._stats["compute_seconds"] += time.perf_counter() - t0
        self._stats["weight_bytes"] += self._bytes_per_call
        self._stats["calls"] += 1
        self._stats["tokens"] += len(tokens)
        return logits

    def stats(self) -> dict:
        return dict(self._stats)
