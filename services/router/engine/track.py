"""A request's Track: where the router follows one choice of a request, from prefill to its last
token."""
from __future__ import annotations

from dataclasses import dataclass, field

from .backlog import Backlog


@dataclass
class Track:
    rid: str
    prompt: tuple[int, ...]
    prefill: str
    decode: str
    events: Backlog = field(default_factory=Backlog)
    generated: list[int] = field(default_factory=list)
    cached: int = 0                  # prompt tokens the prefix cache served
    marks: list = field(default_factory=list)   # the prompt's images for the snapshot keys (keys.py)
    hold: bool = False               # its prefill worker keeps its states (placement.py)
