"""Continuous batching: which sequences run in the next decode step. Plain Python, no runner.

New sequences wait until a batch slot frees; they join between steps, never inside one.
A cancelled sequence leaves at the next step boundary.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sequence:
    rid: str
    state: Any                       # SequenceState, advanced in place by the runner
    sampler: Any                     # Sampler with this request's params and seed
    history: list[int]               # prompt + generated tokens (the sampler's context)
    policy: Any                      # common.generation.GenerationPolicy: stop ids, max_tokens, the count
    return_state: bool
    next_token: int = -1             # sampled, not yet fed to the runner
    logits: Any = None               # (vocab,) what next_token was sampled from
    matcher: Any = None              # common.grammar.Matcher when the request has a grammar
    ahead: Any = None                # its mask_ahead.Ahead: the next mask, filled off the loop
    parked: bool = False             # holds `logits` to sample once its grammar's mask is ready
    mask: Any = None                 # (vocab,) bool, a ready mask for a speculative cycle
    draft: Any = None                # common.speculative.Drafting when it speculates (never with a grammar)
    hold_at: str = ""                # the prefill worker that keeps its final state too; "": none
    since: int = 0                   # the router holds its KV rows before this; Finished carries the rest


@dataclass
class BatchScheduler:
    max_batch: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def cancel(self, rid: str) -> Sequence | None:
        for group in (self.running, self.waiting):
            for seq in group:
                if seq.rid == rid:
                    group.remove(seq)
                    return seq
        return None

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into free batch slots; returns those that joined."""
        joined = []
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting.popleft()
            self.running.append(seq)
            joined.append(seq)
        return joined

    def retire(self, seq: Sequence) -> None:
        self.running.remove(seq)

    def __len__(self) -> int:
        return len(self.running) + len(self.waiting)
