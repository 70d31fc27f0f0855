"""A prompt's tokens counted against a limit without tokenizing more than the limit allows.

Before tokenizing: no token stands for more than `max_bytes` bytes of normalized text (the
longest string in the vocabulary, when every byte has a token of its own, so nothing is dropped),
so a text of B bytes is at least ceil(B / max_bytes) tokens; one that cannot fit is refused by its
length alone. The bytes are counted as the library sees them: split at the added tokens it matches
(each one token), each piece NFC-normalized on its own.

While tokenizing: the text is cut at safe points and tokenized a group of pieces at a time,
stopping once past the limit. A point just after a newline and before an ASCII letter or digit is
a boundary of both Qwen split regexes (no pre-token runs from a newline into a letter or digit),
and NFC never composes across a newline, so the pieces' ids joined are the whole text's ids.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import re
import unicodedata
from typing import Callable, Iterator

CHUNK_CHARS = 1 << 14           # a piece is cut at the first safe point past this many characters
GROUP = 8                       # pieces per encode_batch: the library's threads share a group
TRIM_BYTES = 1 << 20            # after texts this large, the allocator gives freed memory back
SAFE_SPLIT = re.compile(r"\n(?=[A-Za-z0-9])")


class PromptTooLong(ValueError):
    """More tokens than the limit: `at_least` is a lower bound on the count."""

    def __init__(self, at_least: int, limit: int):
        super().__init__(f"the prompt is more than {limit} tokens (at least {at_least})")
        self.at_least, self.limit = at_least, limit


class TokenBudget:
    def __init__(self, vocab: dict[str, int], added: list[str], byte_chars: set[str], chunkable: bool):
        """`vocab`: token strings (byte-level: a character per byte); `added`: the non-special added
        tokens the library matches in text; `chunkable`: the split regex is one of the Qwen family's."""
        self.max_bytes = max(len(s.encode()) for s in vocab) if byte_chars <= vocab.keys() else None
        strings = sorted(set(added), key=len, reverse=True)          # leftmost-longest, as the library
        self._added = re.compile("|".join(map(re.escape, strings))) if strings else None
        self.chunkable = chunkable and not any("\n" in s or "\r" in s for s in strings)

    def at_least(self, texts: list[str]) -> int:
        """A lower bound on the tokens of `texts` read as text (0 without a byte bound)."""
        if self.max_bytes is None:
            return 0
        count = size = 0
        for text in texts:
            pieces = self._added.split(text) if self._added is not None else [text]
            count += len(pieces) - 1                                  # the added tokens, one each
            size += sum(len(unicodedata.normalize("NFC", p).encode()) for p in pieces)
        return count + -(-size // self.max_bytes)

    def encode(self, encode_batch: Callable[[list[str]], list[list[int]]], texts: list[str],
               limit: int) -> list[list[int]]:
        """Each text's ids, as encode_batch(texts) gives them; PromptTooLong as soon as the count
        passes `limit`, before tokenizing when the bytes alone say so."""
        try:
            bound = self.at_least(texts)
            if bound > limit:
                raise PromptTooLong(bound, limit)
            if not self.chunkable:
                out = encode_batch(texts)
                if sum(map(len, out)) > limit:
                    raise PromptTooLong(sum(map(len, out)), limit)
                return out
            return self._pieces(encode_batch, texts, limit)
        finally:
            if sum(map(len, texts)) >= TRIM_BYTES:
                _trim()

    def _pieces(self, encode_batch, texts: list[str], limit: int) -> list[list[int]]:
        out: list[list[int]] = []
        count = 0
        for text in texts:
            ids: list[int] = []
            pieces = chunks(text)
            while group := [p for _, p in zip(range(GROUP), pieces)]:
                for part in encode_batch(group):
                    ids += part
                    count += len(part)
                if count > limit:
                    raise PromptTooLong(count, limit)
            out.append(ids)
        return out


def chunks(text: str) -> Iterator[str]:
    """`text` cut at safe points, each piece CHUNK_CHARS long or more (the last may be shorter)."""
    pos = 0
    while pos < len(text):
        m = SAFE_SPLIT.search(text, pos + CHUNK_CHARS) if len(text) - pos > CHUNK_CHARS else None
        end = m.start() + 1 if m else len(text)
        yield text[pos:end]
        pos = end


def _libc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0): the freed buffers of a large encode go back to the system, not kept
    in the allocator's per-thread arenas; a no-op elsewhere."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0) and None


_trim = _libc_trim()
