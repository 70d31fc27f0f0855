"""Hash-chain keys over token blocks, and over the images in them.

key(block i) = H(key(block i-1) || tokens of block i || marks of block i). Two sequences share a
block key exactly when they share every token up to the end of that block, so the longest cached
prefix is found by walking the chain of the query and stopping at the first unknown key.

A mark is an image's (position of its first image token, digest of its content): every image
token is the same id, so the tokens alone cannot tell two images apart. A block or tail holds the
marks of the images that start inside it, so two prompts with different images share no key past
the first image token, and a repeated image keys as the first did. Text alone has no marks, and
its keys are those of text before images existed.
"""
from __future__ import annotations

import hashlib
from typing import Iterator, Sequence

import numpy as np

ROOT = b"\0" * 16
Marks = Sequence[tuple[int, bytes]]          # (position, image digest), by position


def _h(prev: bytes, tokens: Sequence[int], marks: bytes = b"") -> bytes:
    return hashlib.blake2b(prev + np.asarray(tokens, dtype="<u4").tobytes() + marks, digest_size=16).digest()


def marks_in(marks: Marks, lo: int, hi: int) -> bytes:
    """The bytes of the marks at positions [lo, hi): each position (8 bytes) and its digest."""
    return b"".join(int(p).to_bytes(8, "little") + d for p, d in marks if lo <= p < hi)


def chain(tokens: Sequence[int], block: int, marks: Marks = ()) -> Iterator[bytes]:
    """Keys of each full block of `tokens`, in order."""
    prev = ROOT
    for start in range(0, len(tokens) - block + 1, block):
        prev = _h(prev, tokens[start:start + block], marks_in(marks, start, start + block))
        yield prev


def tail_key(base: bytes, tail: Sequence[int], marks: bytes = b"") -> bytes:
    """Key of a position inside a block: the last full-block key plus the partial tail (and the
    marks_in of the tail's positions)."""
    return _h(base + b"tail", tail, marks)


def prefix_key(tokens: Sequence[int], block: int, marks: Marks = ()) -> bytes:
    """The snapshot key of the state after `tokens`, as SnapshotStore.put files it: the chain's last
    full block, then the tail."""
    blocks = list(chain(tokens, block, marks))
    base = blocks[-1] if blocks else ROOT
    return tail_key(base, tokens[len(blocks) * block:], marks_in(marks, len(blocks) * block, len(tokens)))
