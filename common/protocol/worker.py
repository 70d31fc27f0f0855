"""Messages that every worker (prefill and decode) receives, on its PULL inbox.

Frame layout and version: see `codec` (frame 0 msgpack header, frames 1..n arrays; its VERSION).

    0x01 HelloAck   router -> worker: registration accepted (or refused, with the reason)
    0x02 Cancel     router -> worker: drop request `rid` wherever it is (queued, running)
"""
from __future__ import annotations

from .codec import Message, message


@message(0x01)
class HelloAck(Message):
    worker_id: str
    accepted: bool
    reason: str


@message(0x02)
class Cancel(Message):
    reason: str
