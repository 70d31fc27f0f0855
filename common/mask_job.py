"""Grammar masks filled in worker threads, their work timed as CPU, and the ones given up on demoted.

llguidance releases the GIL while it fills a mask, so a mask can be filled while the caller goes
on; but a mask cannot be stopped once begun. So whoever waits for one and gives up (its budget
passed) demotes it: its thread drops to the lowest CPU priority (SCHED_IDLE, else nice 19), so
that it only takes a core no one else wants, and leaves the pool when the mask ends, a fresh
thread taking its place. A mask's work is its thread's CPU time, which a
loaded host does not inflate. Decode fills every mask so (services/decode/mask_ahead.py); the
router times a grammar's first one (services/router/frontend/structured.py).
"""
from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np

from . import grammar

LOWEST_PRIORITY = 19                # nice of a demoted mask where SCHED_IDLE is refused
WORKER_NICE = 5                     # every mask worker yields a little to the batch loop
# masks given up on that may still run at once in one pool: each keeps its grammar's lexer (over
# 100 MB for the costliest patterns) until it ends, so past this a new mask fails at once
MAX_ABANDONED = 4


class MasksBusy(grammar.GrammarError):
    """The pool still runs MAX_ABANDONED masks given up on; a retry later may be served."""


def lower_priority(tid: int) -> None:
    """Thread `tid` (a native id) at the lowest priority: SCHED_IDLE yields at once to any other
    thread that wakes (Linux threads have their own policy and nice value)."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, LOWEST_PRIORITY)
    except (AttributeError, OSError):    # elsewhere: the masks keep the process's priority
        pass


def _cpu_clock() -> int | None:
    """This thread's CPU clock, for reading from another thread; None where there is none."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


class MaskJob:
    """One mask of one matcher, filled by a worker; `seconds` is its work, the worker's CPU time."""

    def __init__(self, matcher: grammar.Matcher, n_vocab: int, finished: threading.Event | None = None):
        self.matcher, self.n_vocab, self.finished = matcher, n_vocab, finished
        self.clock: int | None = None                   # the worker thread's CPU clock, once started
        self.tid = 0                                    # and its native id
        self.demoted = False                            # given up on
        self.lowered = False                            # its thread dropped to the lowest priority
        self.released = False                           # no longer counted among the pool's workers
        self._lock = threading.Lock()
        self.cpu0 = self.wall0 = 0.0
        self.seconds = 0.0
        self.mask: np.ndarray | None = None             # (n_vocab,) bool
        self.error: Exception | None = None
        self.done = threading.Event()

    def run(self) -> None:
        with self._lock:
            if self.demoted:                            # given up on before it began, or refused
                self.error = self.error or grammar.GrammarError("grammar: given up on")
                self.done.set()
                return
            self.cpu0, self.wall0, self.tid = time.thread_time(), time.perf_counter(), threading.get_native_id()
            self.clock = _cpu_clock()
        try:
            bits = grammar.fill_masks([self.matcher], self.n_vocab)[0]
            if self.matcher.m.is_error():
                raise grammar.GrammarError(f"grammar: {grammar.engine_error(self.matcher.m)}")
            self.mask = grammar.allowed(bits, self.n_vocab)
        except Exception as e:                          # handed to whoever waits
            self.error = e
        with self._lock:                                # so that demote lowers this thread only while it works
            self.seconds = self._spent()
            self.done.set()
        if self.finished is not None:
            self.finished.set()

    def work(self) -> float:
        """CPU seconds so far (all of them once done; 0 while queued for a worker)."""
        if self.done.is_set():
            return self.seconds
        if not self.tid:                                # not begun
            return 0.0
        clock = self.clock
        if clock is None:                               # a platform without thread clocks: wall time
            return time.perf_counter() - self.wall0
        return time.clock_gettime(clock) - self.cpu0

    def _spent(self) -> float:
        """In the worker: its work so far."""
        return time.thread_time() - self.cpu0 if self.clock is not None else time.perf_counter() - self.wall0

    def demote(self) -> None:
        """Given up on: not begun, it never will be; begun, its thread drops to the lowest priority."""
        with self._lock:
            self.demoted = True
            if self.tid and not self.done.is_set():
                lower_priority(self.tid)
                self.lowered = True


class MaskWorkers:
    """Up to `n` threads, a little below normal priority (nice 5, so that the batch loop comes
    first), that run MaskJobs in order; one whose job was demoted while it ran no longer counts,
    and leaves when the job ends."""

    def __init__(self, n: int, name: str):
        self.n, self.name = n, name
        self.jobs: queue.SimpleQueue[MaskJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        self.abandoned = 0                              # demoted jobs whose threads still run them

    def submit(self, job: MaskJob) -> None:
        """Queue `job`; while MAX_ABANDONED given-up masks still run, it fails at once with MasksBusy."""
        with self._lock:
            if self.abandoned >= MAX_ABANDONED:
                job.demoted = True
                job.error = MasksBusy(f"grammar: {self.abandoned} costly grammars are still being given up on; "
                                      "retry later")
            self.jobs.put(job)
            if self._live < self.n:
                self._live += 1
                threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def demote(self, job: MaskJob) -> None:
        job.demote()
        with self._lock:
            if job.lowered:
                self._release(job)

    def _release(self, job: MaskJob) -> None:
        if not job.released:
            job.released = True
            self._live -= 1
            self.abandoned += 1

    def _work(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
        except (AttributeError, OSError):
            pass
        while (job := self.jobs.get()) is not None:
            job.run()
            with self._lock:
                if job.lowered:                         # this thread stays at the lowest priority: it goes
                    self._release(job)
                    self.abandoned -= 1
                    return
        with self._lock:
            self._live -= 1

    def close(self) -> None:
        for _ in range(self.n):
            self.jobs.put(None)
