"""Logging at a bounded rate, for the paths that a flood of bad input can reach."""
from __future__ import annotations

import logging
import time


class LogLimiter:
    """Logs the first `burst` complaints of each `interval` seconds, then one line saying how
    many more there were, so that a flood of bad messages cannot fill the disk."""

    def __init__(self, logger: logging.Logger, what: str, burst: int = 10, interval: float = 10.0):
        self.logger, self.what, self.burst, self.interval = logger, what, burst, interval
        self._start, self._logged, self._suppressed = time.monotonic(), 0, 0

    def __call__(self, fmt: str, *args, exc_info: bool = False) -> None:
        self.flush()
        if self._logged < self.burst:
            self._logged += 1
            self.logger.error(fmt, *args, exc_info=exc_info)
        else:
            self._suppressed += 1

    def flush(self) -> None:
        """Start a new interval when the current one is over, with the summary of the last."""
        if time.monotonic() - self._start < self.interval:
            return
        if self._suppressed:
            self.logger.error("%s: %d more not logged in the last %.0f s", self.what, self._suppressed,
                              time.monotonic() - self._start)
        self._start, self._logged, self._suppressed = time.monotonic(), 0, 0
