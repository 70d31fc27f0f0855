"""Progress lines for long byte-counting work (mapping, repacking): at most one every few
seconds, and only for work large enough to be worth telling."""
from __future__ import annotations

import logging
import time
from typing import Callable

EVERY_S = 2.0


def byte_progress(log: logging.Logger, what: str, min_total: int) -> Callable[[int, int], None]:
    """A progress(done, total) callback logging "<what>: x of y GiB (t s)" when total >= min_total."""
    t0, last = time.monotonic(), [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if total >= min_total and (now - last[0] >= EVERY_S or done == total):
            last[0] = now
            log.info("%s: %.1f of %.1f GiB (%.0f s)", what, done / 2**30, total / 2**30, now - t0)

    return progress
