"""The CPU runner's prefill, an object CpuRunner owns: the prompt through fm_prefill a chunk of
tokens at a time, every weight read once per chunk while the recurrences run token by token.

Chunks start every `chunk` tokens from the call's start and are also cut at its checkpoints; a
chunk that ends on one asks fm_prefill for that row's logits and is followed by a copy of the
linear layers' state. Checkpoints at multiples of the chunk therefore cost no chunk (no weight
pass) of their own, only an LM-head row each.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from common.model.config import ModelConfig
from common.reference.multimodal import MropeInput, mrope_rows
from common.state import Checkpoint, SequenceState, checkpoint_marks
from native.cpu_lib import ffi, lib
from native.cpu_rows import StateRows

# prompt tokens per native prefill chunk. Each weight is read once per chunk; at 8 experts a token,
# a chunk of 256 reaches nearly every expert of a 256-expert layer once, where chunks of 64 read
# most of them four times over (a real-width layer: 0.45 GB of experts).
NATIVE_CHUNK = 256


def chunk_bounds(n: int, chunk: int, marks: Sequence[int] = ()) -> list[tuple[int, int]]:
    """The [start, end) row ranges of a call of n tokens: every `chunk` rows, also cut at `marks`."""
    cuts = sorted(set(range(chunk, n, chunk)) | set(marks) | {n})
    return list(zip([0, *cuts[:-1]], cuts))


class CpuPrefill:
    """Runs prompts through the runner's engine; `rows` lays out each sequence's state for C."""

    def __init__(self, rows: StateRows, engine, cfg: ModelConfig, model_path):
        self.rows, self._engine, self.cfg, self.model_path = rows, engine, cfg, model_path
        self.last_bytes = 0.0   # the weight bytes of the last call's chunks
        self.last_chunks = 0    # its fm_prefill calls (weight passes)

    def run(self, tokens, state: SequenceState, checkpoints: Sequence[int], chunk: int, all_logits: bool,
            mm: MropeInput | None, progress: Callable[[], None] | None) -> tuple[np.ndarray, list[Checkpoint]]:
        """Logits (every row, or the last: [1, vocab]) and the Checkpoint at each of `checkpoints`."""
        ids = self.rows.token_ids(tokens)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        self.rows.check_kv_type(state)
        marks = checkpoint_marks(checkpoints, state.pos, ids.size)
        rope = mrope_rows(self.cfg, self.model_path, mm, ids.size)
        out = np.empty((ids.size if all_logits else 1, self.cfg.vocab_size), np.float32)
        caught: list[Checkpoint] = []
        self.last_bytes = 0.0   # the weight bytes of all chunks
        self.last_chunks = 0
        for start, end in chunk_bounds(ids.size, chunk, marks):
            n, marked = end - start, end in marks
            dest = out[start:end] if all_logits else (np.empty((1, self.cfg.vocab_size), np.float32)
                                                      if marked else out)
            logit_rows = n if all_logits else (1 if marked or end == ids.size else 0)
            self._prefill_chunk(ids[start:end], state, start, rope, mm, logit_rows, dest)
            self.last_chunks += 1
            if marked:
                caught.append(Checkpoint(state.pos, [c.copy() for c in state.conv], [s.copy() for s in state.ssm],
                                         dest[-1].copy()))
            if progress is not None:
                progress()
        return out, caught

    def _prefill_chunk(self, part: np.ndarray, state: SequenceState, start: int, rope, mm, logit_rows: int,
                       dest: np.ndarray) -> None:
        """One fm_prefill call over `part`, rows start.. of the call; advances the state."""
        n = part.size
        keep: list = []
        seq = ffi.new("fm_seq *")
        kbufs, vbufs = self.rows.seq(state, seq, keep, rows=n)
        tok = ffi.new("int[]", [int(t) for t in part])
        out_c = ffi.cast("float *", dest.ctypes.data)
        if rope is None:
            err = lib.fm_prefill(self._engine, n, tok, seq, logit_rows, out_c)
        else:
            rows = np.ascontiguousarray(rope[start:start + n])
            seq.mrope = ffi.cast("const int *", rows.ctypes.data)
            mine = (mm.rows >= start) & (mm.rows < start + n)
            at = np.ascontiguousarray(mm.rows[mine] - start, np.int32)
            embd = np.ascontiguousarray(mm.embeds[mine], np.float32)
            keep += [rows, at, embd]
            err = lib.fm_prefill_embd(self._engine, n, tok, seq, int(at.size),
                                      ffi.cast("const int *", at.ctypes.data),
                                      ffi.cast("const float *", embd.ctypes.data), logit_rows, out_c)
        if err != 0:
            raise MemoryError("native prefill ran out of scratch memory")
        self.last_bytes += lib.fm_engine_bytes(self._engine)
        self.rows.advance(state, n, kbufs, vbufs)
