"""The copies of a request that asks for `n` > 1 choices: one prefill, then n decodes.

Copy 0 is dispatched as any request, and its prefill is asked for a Snapshot at the prompt's
end (past every checkpoint when the prefix cache takes none). When that Snapshot arrives, its
state (assembled from the KV rows the router holds: snapshot_chains.py) and logits go to decode
once for each other copy, so the prompt is prefilled once and each copy decodes its own
sequence from the same state. A prompt the prefix cache holds whole
goes to decode n times at once. Either way the router holds the prompt's snapshot, so decode sends
back only the KV rows past it (DecodeRequest.since). Copy i samples with SamplingParams.for_choice(i) (seed + i).
When copy 0's prefill fails, or ends without the Snapshot, the waiting copies fail with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from common.protocol.decode import DecodeRequest
from common.protocol.router import Failed
from common.sampling import SamplingParams
from common.state import state_bytes

MAX_CHOICES = 16                # `n`: copies beyond this are better sent as separate requests


@dataclass
class Copies:
    """Copies of one request, with what their DecodeRequests need besides the state."""

    tracks: list                 # dispatch.Track, one per copy
    sampling: list[SamplingParams]
    history: list[int]
    max_tokens: int
    stops: list[int]
    keep: bool

    def send(self, state: list | None, logits, kv_type: str, link: Callable[[str], object | None],
             live: Callable[[str], bool], rope_delta: int = 0) -> int:
        """One DecodeRequest per copy still `live` (by rid), to the decode worker `link` gives
        for its worker id (None: gone, and the copy fails); the number sent."""
        sent = 0
        for track, sampling in zip(self.tracks, self.sampling):
            if not live(track.rid):                  # ended while it waited for the prefill
                continue
            out = link(track.decode)
            if out is None:
                track.events.put_nowait(Failed(track.rid, track.decode, "its decode worker went away"))
                continue
            out.put(DecodeRequest(track.rid, len(self.history), self.history, sampling, self.max_tokens,
                                  self.stops, self.keep, state, logits, kv_type, rope_delta,
                                  since=len(self.history)))
            sent += 1
        return sent

    def fail(self, why: str) -> None:
        for track in self.tracks:
            track.events.put_nowait(Failed(track.rid, track.prefill, why))


class CopySends:
    """Mixed into the Dispatcher (dispatch.py), whose registry, tracks, copies and metrics these use."""

    def _send_copies(self, c: Copies, state: list | None, logits, rope_delta: int = 0) -> None:
        sent = c.send(state, logits, self.kv_type, lambda wid: getattr(self.registry.workers.get(wid), "link", None),
                      lambda rid: rid in self.tracks, rope_delta)
        self.metrics.state_bytes_sent.labels("decode").inc(sent * state_bytes(state))

    def _fail_copies(self, rid: str, why: str) -> None:
        if rid in self.copies:
            self.copies.pop(rid).fail(why)


def snapshot_every(cache_every: int, prompt_len: int, n: int) -> int:
    """The snapshot interval that a prefill of `n` copies asks for: the cache's, which includes
    the prompt's end, else one past the prompt, which gives only the end."""
    return cache_every or (prompt_len + 1 if n > 1 else 0)
