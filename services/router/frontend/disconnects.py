"""A client that leaves ends what the router waits on for it: `first_of` runs awaitables until the
first ends, `until_disconnect(request)` is the one that ends when the client goes (after its body
has been read), and `admitted` waits for an admission slot unless the client goes first, so that a
request whose client left while queued leaves the queue (Admission.acquire gives back a slot that
came at that moment)."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from starlette.requests import Request


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first_of(*coros) -> None:
    """Run until the first finishes; cancel the others; re-raise its error."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        t.result()


async def admitted(request: Request, admit: Callable[[], Awaitable]) -> bool:
    """Await admit() (a slot); False when the client left first."""
    got = []

    async def slot() -> None:
        await admit()
        got.append(True)

    await first_of(slot(), until_disconnect(request))
    return bool(got)
