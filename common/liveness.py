"""A worker's liveness as progress: the step counter its heartbeats carry, the exit of a worker the
router found stalled, and the test hook that hangs a compute loop on purpose.

Heartbeats come from a thread of their own, so they prove only that the process lives. Each one
also carries `steps` (turns of the compute loop done) and `busy` (it holds requests, or messages
wait for the loop). The router reports a worker whose `steps` stay put while it is busy for
--stall-timeout as stalled, fails its requests with a retryable error and answers its next
heartbeats with a refused HelloAck; on that, the worker exits with EXIT_STALLED (`exit_stalled`),
since only a new process can free a loop stuck in native code. Its supervisor (`fermium up`'s,
systemd's Restart=) starts it again like any worker that died. The router alone judges, so one
setting governs the whole deployment and a worker without a reachable router never exits.

HANG_ENV is a test hook, inert unless that variable is set (no deployment sets it): it names a
file that holds a role; the first worker of that role to take a request while the file exists
removes it (one worker wins, and the restarted one does not hang again), writes `<file>.hung`
with the wall-clock time, and then its compute loop sleeps forever, holding that request, while
its heartbeat thread goes on.
"""
from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("fermium.worker")

HANG_ENV = "FERMIUM_TEST_HANG_FILE"
EXIT_STALLED = 75                # EX_TEMPFAIL: the worker is worth starting again


class StepCounter:
    """Turns of the compute loop done; the loop counts, the heartbeat thread reads."""

    def __init__(self):
        self.steps = 0

    def advance(self) -> None:
        self.steps += 1          # one writer; a reader may see the previous value, which only delays


def hang_hook(role: str, environ=os.environ):
    """The test hook of HANG_ENV for a worker of `role`: a callable for each request taken, or None."""
    path = environ.get(HANG_ENV)
    if not path:
        return None

    def maybe_hang() -> None:
        try:
            with open(path) as f:
                if f.read().strip() != role:
                    return
            os.remove(path)          # only one worker of the role gets past this
        except OSError:
            return
        with open(f"{path}.hung", "w") as f:
            f.write(repr(time.time()))
        log.warning("%s: %s is set; this compute loop now hangs on purpose", role, HANG_ENV)
        threading.Event().wait()
    return maybe_hang


def exit_stalled(role: str, reason: str) -> None:
    """The router no longer takes this worker (its loop stalled): exit, for a supervisor to restart it."""
    log.critical("%s: the router refused this worker after registration (%s); exiting with %d so that "
                 "its supervisor starts a new one", role, reason, EXIT_STALLED)
    logging.shutdown()
    os._exit(EXIT_STALLED)
