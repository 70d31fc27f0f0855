"""Ids to text one token at a time, as a stream prints them: whole UTF-8 characters only."""
from __future__ import annotations

import codecs
from typing import Iterable, Protocol


class TokenBytes(Protocol):
    """What the stream asks of its tokenizer (common.model.tokenizer.Tokenizer is one)."""

    def _check_ids(self, ids: Iterable[int]) -> list[int]: ...

    def is_special(self, token_id: int) -> bool: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class DetokenizeStream:
    """Turns ids into text one at a time; emits only whole UTF-8 characters, each exactly once."""

    def __init__(self, tokenizer: TokenBytes, *, skip_special: bool = False):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        self._tok._check_ids([token_id])
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def finish(self) -> str:
        """What is still held back (an unfinished character comes out as U+FFFD)."""
        return self._utf8.decode(b"", final=True)
