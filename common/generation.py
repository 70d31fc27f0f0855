"""When a sequence ends, and which of its tokens are shown: the one policy of decode, the router
and `fermium generate`. Plain Python.

The semantics are vLLM's (and so what OpenAI clients expect):
- A stop id (EOS or a request's stop token) ends the sequence with finish reason "stop". It is
  not emitted, so it is never in the text, but it counts as a completion token, as vLLM counts
  the EOS token in `usage.completion_tokens`.
- The max_tokens-th token is emitted and ends the sequence with "length". A stop id sampled
  there is still "stop": the model ended the answer (vLLM v1, which checks the length first,
  says "length" there).
- A stop string ends it with "stop": the text is cut where the string starts, and the tokens up
  to the one that completed it count. It is matched on text, so only a caller that
  detokenizes (the router) applies it, one token at a time.

`stop_reason` says what ended it, as vLLM's does: the stop id or the stop string, else None.
"""
from __future__ import annotations

from typing import Iterable


class StopStrings:
    """Holds back the tail that could still become a stop string; finds the earliest match."""

    def __init__(self, stops: Iterable[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text safe to show, the stop string that ended the output or None)."""
        self.pending += text
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            at, stop = min(hits)
            out, self.pending = self.pending[:at], ""
            return out, stop
        cut = len(self.pending) - self.hold
        out, self.pending = (self.pending[:cut], self.pending[cut:]) if cut > 0 else ("", self.pending)
        return out, None

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class GenerationPolicy:
    """One sequence's end. Feed each sampled token to `accept`, in order, and (where the caller
    detokenizes) the text of each emitted token to `text`; `finished`, `finish_reason`,
    `stop_reason` and `generated` (the completion tokens) say where it stands."""

    def __init__(self, max_tokens: int, stop_ids: Iterable[int] = (), stop: Iterable[str] = ()):
        self.max_tokens = max_tokens
        self.stop_ids = frozenset(stop_ids)
        self.strings = StopStrings(stop)
        self.generated = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def accept(self, token: int) -> bool:
        """Count a sampled token; True when it is emitted. After the end, a token is neither."""
        if self.finished:
            return False
        self.generated += 1
        if token in self.stop_ids:
            self.finish_reason, self.stop_reason = "stop", token
            return False
        if self.generated >= self.max_tokens:
            self.finish_reason = "length"
        return True

    def text(self, piece: str) -> str:
        """The text of an emitted token in; what is safe to show out (a tail that may become a
        stop string waits). A stop string ends the sequence, even on its last token."""
        if isinstance(self.stop_reason, str):
            return ""
        out, stop = self.strings.feed(piece)
        if stop is not None:
            self.finish_reason, self.stop_reason = "stop", stop
        return out

    def flush(self) -> str:
        """The text held back, at the end."""
        return "" if isinstance(self.stop_reason, str) else self.strings.flush()
