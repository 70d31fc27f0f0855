"""Decode's grammar masks computed ahead of need, off the batch loop, each timed against a budget.

Once a grammar sequence has taken a token, its next allowed-token mask is computed in a worker
thread (llguidance releases the GIL while it fills one) while the batch step runs, as
llguidance's own servers do. The loop takes a mask when it is ready and leaves the sequence out
of the batch until then, so a costly grammar slows only itself. The workers run at the lowest
CPU priority, so that a mask, which cannot be stopped once begun, never takes a core from the
batch. Each mask's work is its worker thread's CPU time (a loaded host does not count against
it): a sequence whose mask runs past the per-step budget, or whose masks add up past the
per-request budget, fails with GrammarBudget while the batch goes on.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common import grammar


class GrammarBudget(grammar.GrammarError):
    """A grammar whose masks cost more time than decode allows one request."""


LOWEST_PRIORITY = 19                # nice of the mask workers


def _lower_priority() -> None:
    """This thread at the lowest priority (Linux threads have their own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    except (AttributeError, OSError):    # elsewhere: the masks keep the process's priority
        pass


class MaskJob:
    """One mask of one matcher, filled by a worker; `seconds` is its work, the worker's CPU time."""

    def __init__(self, matcher: grammar.Matcher, n_vocab: int, finished: threading.Event):
        self.matcher, self.n_vocab, self.finished = matcher, n_vocab, finished
        self.clock: int | None = None                   # the worker thread's CPU clock, once started
        self.cpu0 = 0.0
        self.seconds = 0.0
        self.mask: np.ndarray | None = None             # (n_vocab,) bool
        self.error: Exception | None = None
        self.done = threading.Event()

    def run(self) -> None:
        self.cpu0 = time.thread_time()
        self.clock = time.pthread_getcpuclockid(threading.get_ident())
        try:
            bits = grammar.fill_masks([self.matcher], self.n_vocab)[0]
            if self.matcher.m.is_error():
                raise grammar.GrammarError(f"grammar: {grammar.engine_error(self.matcher.m)}")
            self.mask = grammar.allowed(bits, self.n_vocab)
        except Exception as e:                          # handed to the loop, which fails this sequence alone
            self.error = e
        self.seconds = time.thread_time() - self.cpu0
        self.done.set()
        self.finished.set()

    def work(self) -> float:
        """CPU seconds so far (all of them once done; 0 while queued for a worker)."""
        if self.done.is_set():
            return self.seconds
        clock = self.clock
        return 0.0 if clock is None else time.clock_gettime(clock) - self.cpu0


class Ahead:
    """A sequence's grammar: its matcher, the mask in flight and the time its masks have cost."""

    def __init__(self, matcher: grammar.Matcher):
        self.matcher = matcher
        self.job: MaskJob | None = None
        self.spent = 0.0


class MaskPool:
    """The workers that fill masks ahead, and the budgets they are held to (seconds)."""

    def __init__(self, n_vocab: int, workers: int, step_budget: float, request_budget: float, metrics=None):
        self.n_vocab, self.step_budget, self.request_budget = n_vocab, step_budget, request_budget
        self.metrics = metrics
        self.finished = threading.Event()               # set whenever any job ends
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode-grammar-mask",
                                        initializer=_lower_priority)

    def submit(self, ahead: Ahead) -> None:
        """Start the mask of the matcher's present state; the matcher is not touched until it is taken."""
        ahead.job = MaskJob(ahead.matcher, self.n_vocab, self.finished)
        self._pool.submit(ahead.job.run)

    def poll(self, ahead: Ahead) -> np.ndarray | None:
        """The mask once ready (and taken), None while it is being filled; GrammarBudget past a
        budget, GrammarError when the grammar fails."""
        job = ahead.job
        assert job is not None, "poll before submit"
        done = job.done.is_set()                        # before the work is read, so a finished job counts whole
        step = job.work()
        if step > self.step_budget:
            raise GrammarBudget(f"the grammar took over {self.step_budget * 1000:.0f} ms for one token "
                                "(decode's --grammar-step-budget-ms); simplify the schema")
        if ahead.spent + step > self.request_budget:
            raise GrammarBudget(f"the grammar took over {self.request_budget:.0f} s in all "
                                "(decode's --grammar-request-budget-s); simplify the schema")
        if not done:
            return None
        ahead.job, ahead.spent = None, ahead.spent + job.seconds
        if self.metrics is not None:
            self.metrics.grammar_mask_time.observe(job.seconds)
        if job.error is not None:
            raise job.error
        return job.mask

    def mark(self) -> None:
        """Forget the jobs ended so far: call before polling, so that `wait` wakes for a later one."""
        self.finished.clear()

    def wait(self, timeout: float) -> None:
        """Until a job ends after `mark` or `timeout` seconds pass: the nap when no sequence can step."""
        self.finished.wait(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
