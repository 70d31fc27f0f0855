"""Supervision of `fermium up`'s children: a child that dies is started again, with backoff.

The delay before a restart starts at RESTART_FIRST_S and doubles with each death up to
RESTART_MAX_S, so a child that cannot start does not spin; a child that ran for RESTART_RESET_S
counts as healthy again and its next death waits RESTART_FIRST_S. Every death and restart is
a line on stderr. The stack never stops because a child died: only `stopping` ends the loop.
A worker whose compute loop stalls is restarted the same way: the router (--stall-timeout) refuses
its heartbeats and the worker exits on that (common.liveness), so no second health check runs here.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 10.0
RESTART_RESET_S = 30.0
POLL_S = 0.1


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Backoff:
    """The restart delay of one child."""

    first: float = RESTART_FIRST_S
    most: float = RESTART_MAX_S
    reset_after: float = RESTART_RESET_S
    delay: float = 0.0

    def next(self, ran_s: float) -> float:
        """The delay before restarting a child that died after running `ran_s` seconds."""
        self.delay = self.first if ran_s >= self.reset_after or not self.delay else min(self.most, 2 * self.delay)
        return self.delay


class Supervisor:
    """Watches a started Stack and restarts its children that exit."""

    def __init__(self, stack, note: Callable[[str], None] = _stderr, clock: Callable[[], float] = time.monotonic):
        self.stack, self.note, self.clock = stack, note, clock
        self.backoff = {name: Backoff() for name in stack.argv}
        self.started = {name: clock() for name in stack.argv}
        self.due: dict[str, float] = {}          # child -> when it is started again
        self.restarts = 0

    def check(self) -> None:
        """One pass: note the children that died, start those whose delay is over."""
        now = self.clock()
        for name, proc in self.stack.procs.items():
            if name in self.due or proc.poll() is None:
                continue
            ran = now - self.started[name]
            delay = self.backoff[name].next(ran)
            self.due[name] = now + delay
            self.note(f"fermium up: {name} exited with {_status(proc.returncode)} after {ran:.1f} s; "
                      f"restarting it in {delay:g} s")
        for name, when in list(self.due.items()):
            if now >= when:
                del self.due[name]
                self.started[name] = self.clock()
                proc = self.stack.start(name)
                self.restarts += 1
                self.note(f"fermium up: {name} restarted (pid {proc.pid})")

    def run(self, stopping: threading.Event) -> None:
        """Until `stopping` is set (a signal handler sets it)."""
        while not stopping.wait(POLL_S):
            self.check()


def _status(code: int) -> str:
    if code >= 0:
        return f"code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"
