"""Which tokens' logprobs go with which text.

Decode sends each token's log-probability with the token (router.Tokens). The router shows text
later than it gets tokens: the detokenizer waits for whole UTF-8 characters and a stop string's
possible start is held back. A Ledger keeps the tokens in order with where their text starts and
ends, and hands out those whose text has been shown, so that each Delta, and so each streamed
chunk, carries the logprobs of the tokens whose text it carries, as vLLM's do. When a stop string
cuts the text, the tokens that show nothing of it are dropped with it; the answer's logprobs are
then those of the tokens whose text it holds, the last maybe only in part. The frontends give
them their dialect's shape (frontend/logprob_replies.py).
"""
from __future__ import annotations

from common.logprobs import split_tops
from common.protocol.router import Tokens

# a token's (id, log-probability, its top alternatives as (id, log-probability), most likely first)
Entry = tuple[int, float, tuple[tuple[int, float], ...]]


def entries(msg: Tokens) -> list[Entry] | None:
    """The per-token entries of a Tokens message; None when it carries no logprobs."""
    if not msg.logprobs:
        return None
    tops = split_tops(len(msg.tokens), msg.top_ids, msg.top_logprobs)
    return [(t, lp, tuple(top)) for t, lp, top in zip(msg.tokens, msg.logprobs, tops)]


class Ledger:
    """The tokens of one choice whose text is not yet shown, by where their text lies."""

    def __init__(self):
        self.pending: list[tuple[int, int, Entry]] = []     # (start, end) in characters of the detokenized text
        self.end = 0                                       # characters the detokenizer has given
        self.shown = 0                                     # characters shown

    def token(self, entry: Entry, chars: int) -> None:
        """A token whose detokenized piece is `chars` characters long."""
        self.pending.append((self.end, self.end + chars, entry))
        self.end += chars

    def show(self, chars: int) -> None:
        self.shown += chars

    def release(self) -> tuple[Entry, ...]:
        """The tokens of which some text, or all (none, for a token of no text yet), is shown."""
        n = 0
        while n < len(self.pending) and (self.pending[n][0] < self.shown or self.pending[n][1] <= self.shown):
            n += 1
        out, self.pending = self.pending[:n], self.pending[n:]
        return tuple(e for _, _, e in out)

    def rest(self) -> tuple[Entry, ...]:
        out, self.pending = self.pending, []
        return tuple(e for _, _, e in out)
