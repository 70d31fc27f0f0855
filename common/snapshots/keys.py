"""Hash-chain keys over token blocks.

key(block i) = H(key(block i-1) || tokens of block i). Two sequences share a block key exactly
when they share every token up to the end of that block, so the longest cached prefix is found
by walking the chain of the query and stopping at the first unknown key.
"""
from __future__ import annotations

import hashlib
from typing import Iterator, Sequence

import numpy as np

ROOT = b"\0" * 16


def _h(prev: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(prev + np.asarray(tokens, dtype="<u4").tobytes(), digest_size=16).digest()


def chain(tokens: Sequence[int], block: int) -> Iterator[bytes]:
    """Keys of each full block of `tokens`, in order."""
    prev = ROOT
    for start in range(0, len(tokens) - block + 1, block):
        prev = _h(prev, tokens[start:start + block])
        yield prev


def tail_key(base: bytes, tail: Sequence[int]) -> bytes:
    """Key of a position inside a block: the last full-block key plus the partial tail."""
    return _h(base + b"tail", tail)
