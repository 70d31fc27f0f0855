"""A request's undelivered replies: the queue between the worker inbox and the HTTP response (one per
choice, a Track's `events`), bounded in tokens.

A client that reads slower than decode writes fills it. Past UNDELIVERED_TOKENS the request is taken
for a stalled client: its queued tokens are dropped, the workers are told to stop, and what the
response reads next is a Failed that says why. With it queued (`ended`), the request's admission slot
goes back (generation.py); the connection itself goes at `--send-timeout` when the client takes
nothing more (frontend/connections.py).
"""
from __future__ import annotations

import asyncio
from typing import Callable

from common.metrics import RouterMetrics
from common.protocol.router import Failed, Finished, Tokens

UNDELIVERED_TOKENS = 4096       # per choice: far more than a reading client falls behind by


def _tokens(msg) -> int:
    return len(msg.tokens) if isinstance(msg, Tokens) else 0


class Backlog(asyncio.Queue):
    """asyncio.Queue of a Track's messages that counts the tokens it holds."""

    def __init__(self, limit: int = UNDELIVERED_TOKENS):
        super().__init__()
        self.limit, self.tokens, self.overflowed = limit, 0, False
        self.ended = asyncio.Event()          # a Finished or Failed is queued: the workers are done with it

    def _put(self, item) -> None:
        self.tokens += _tokens(item)
        if isinstance(item, (Finished, Failed)):
            self.ended.set()
        super()._put(item)

    def _get(self):
        item = super()._get()
        self.tokens -= _tokens(item)
        return item

    def offer(self, msg, metrics: RouterMetrics, cancel: Callable[[str, str], None]) -> bool:
        """Queue `msg`; True the one time the queue would pass its bound, when its messages are dropped
        for a Failed, cancel(rid, why) stops the workers and `metrics` counts a client dropped. After that
        it takes nothing more."""
        if self.overflowed:
            return False
        if self.tokens + _tokens(msg) <= self.limit:
            self.put_nowait(msg)
            return False
        self.overflowed = True
        metrics.client_dropped("backlog")
        cancel(msg.rid, "the client is not reading")
        while not self.empty():
            self.get_nowait()
        self.put_nowait(Failed(msg.rid, "router", f"the client fell more than {self.limit} tokens behind the "
                                                  f"generation; the request was ended as a stalled client"))
        return True
