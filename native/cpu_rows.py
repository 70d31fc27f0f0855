"""A SequenceState as the rows of a native step: its arrays made writable float32, its KV caches
given room for the rows the step writes (kv_dtype), the fm_seq that points into them, and the state
advanced after the step. Owned by CpuRunner, and handed to the speculative part it owns
(native/cpu_speculative.py), which fills verify rows the same way."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from common.kv_cache import kv_dtype, kv_width
from common.model.config import ModelConfig
from common.state import SequenceState
from native.cpu_tables import same_start, table

KV_GROW = 256   # rows a KV cache grows by at least, so appends are amortised O(1) (without max_context)


class StateRows:
    def __init__(self, cfg: ModelConfig, kv_type: str):
        self.cfg, self.kv_type = cfg, kv_type
        # positions a KV buffer is made with (the decode and prefill servers set their context size):
        # it is then never copied to grow; 0: buffers double as they fill
        self.max_context = 0

    def check_kv_type(self, s: SequenceState) -> None:
        if s.kv_type != self.kv_type:
            raise ValueError(f"state KV cache is {s.kv_type} but this runner keeps {self.kv_type}")

    @staticmethod
    def writable(a: np.ndarray) -> np.ndarray:
        if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable:
            return a
        return np.array(a, np.float32, order="C")

    def kv_room(self, a: np.ndarray, pos: int, rows: int) -> np.ndarray:
        """A buffer whose first pos rows are `a` and that has rows for positions pos..pos+rows-1:
        (grown, n_kv_heads, kv_width) in the runner's kv_dtype."""
        dtype, width = kv_dtype(self.kv_type), kv_width(self.kv_type, self.cfg.head_dim)
        if a.shape[0] != pos:
            raise ValueError(f"KV cache holds {a.shape[0]} positions but the state is at {pos}")
        if a.dtype != dtype or a.shape[1:] != (self.cfg.n_kv_heads, width):
            raise ValueError(f"a {self.kv_type} KV cache needs {dtype} (pos, {self.cfg.n_kv_heads}, {width}) "
                             f"arrays, got {a.dtype} {a.shape}")
        base = a.base
        if (isinstance(base, np.ndarray) and base.ndim == 3 and base.shape[1:] == a.shape[1:]
                and base.shape[0] >= pos + rows and base.dtype == dtype and base.flags.c_contiguous
                and base.flags.writeable and same_start(base, a)):
            return base
        if self.max_context >= pos + rows:
            grown = self.max_context    # the whole context at once: its pages are touched only as rows are written
        else:                           # doubling: amortised O(1), but each growth copies the cache
            grown = pos + max(KV_GROW, pos, rows)
        buf = np.empty((grown, *a.shape[1:]), dtype)
        buf[:pos] = a
        return buf

    def seq(self, s: SequenceState, seq, keep: list, rows: int = 1) -> list[np.ndarray]:
        s.conv = [self.writable(a) for a in s.conv]
        s.ssm = [self.writable(a) for a in s.ssm]
        kbufs = [self.kv_room(a, s.pos, rows) for a in s.k]
        vbufs = [self.kv_room(a, s.pos, rows) for a in s.v]
        lists = [table("float", s.conv), table("float", s.ssm), table("void", kbufs), table("void", vbufs)]
        keep += lists
        seq.pos, seq.rope_delta = s.pos, s.rope_delta
        seq.conv, seq.ssm, seq.k, seq.v = lists
        return kbufs, vbufs

    @staticmethod
    def advance(s: SequenceState, rows: int, kbufs: list[np.ndarray], vbufs: list[np.ndarray]) -> None:
        """The state after the runner wrote `rows` more positions into the buffers of `_seq`."""
        s.pos += rows
        s.k = [buf[:s.pos] for buf in kbufs]
        s.v = [buf[:s.pos] for buf in vbufs]

    def token_list(self, tokens: Sequence[int]) -> list[int]:
        """token_ids as Python ints, for the short lists of a decode step (no numpy round trip)."""
        ids = [int(t) for t in tokens]
        if ids and (min(ids) < 0 or max(ids) >= self.cfg.vocab_size):
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        return ids

    def token_ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        return ids
