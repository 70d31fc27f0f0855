"""The engine's errors: why a request could not run, or stopped. They say nothing of HTTP; each
frontend answers them in its dialect, with its status codes (frontend/errors.py `failure`)."""
from __future__ import annotations


class EngineError(Exception):
    """A request the engine refused, or one that failed after it was admitted."""


class Busy(EngineError):
    """The admission queue is full: retry shortly."""


class NoWorkers(EngineError):
    """No live worker of a role: retry once one registers."""


class DispatchFailed(EngineError):
    """Sending the request to its workers failed: an error of the server's."""


class GenerationError(EngineError):
    """A request that failed after it was admitted (a worker error or a lost worker)."""


class Drained(GenerationError):
    """A request the engine ended, or refused, because the drain time ran out: retry elsewhere."""


class Stalled(GenerationError):
    """A request the engine ended because its worker's compute loop stalled (liveness.py): retryable."""
