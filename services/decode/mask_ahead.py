"""Decode's grammar masks computed ahead of need, off the batch loop, each timed against a budget.

Once a grammar sequence has taken a token, its next allowed-token mask is computed in a worker
thread (llguidance releases the GIL while it fills one) while the batch step runs, as
llguidance's own servers do. The loop takes a mask when it is ready and leaves the sequence out
of the batch until then, so a costly grammar slows only itself. Each mask's work is its worker
thread's CPU time (a loaded host does not count against it): a sequence whose mask runs past the
per-step budget, or whose masks add up past the per-request budget, fails with GrammarBudget
while the batch goes on, and its mask, which cannot be stopped, goes on at the lowest CPU
priority (common.mask_job).
"""
from __future__ import annotations

import threading

import numpy as np

from common import grammar
from common.mask_job import MaskJob, MaskWorkers


class GrammarBudget(grammar.GrammarError):
    """A grammar whose masks cost more time than decode allows one request."""


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
        self._pool = MaskWorkers(workers, "decode-grammar-mask")

    def submit(self, ahead: Ahead) -> None:
        """Start the mask of the matcher's present state; the matcher is not touched until it is taken."""
        ahead.job = MaskJob(ahead.matcher, self.n_vocab, self.finished)
        self._pool.submit(ahead.job)

    def poll(self, ahead: Ahead) -> np.ndarray | None:
        """The mask once ready (and taken), None while it is being filled; GrammarBudget past a
        budget, GrammarError when the grammar fails."""
        job = ahead.job
        assert job is not None, "poll before submit"
        done = job.done.is_set()                        # before the work is read, so a finished job counts whole
        step = job.work()
        if step > self.step_budget or ahead.spent + step > self.request_budget:
            self._pool.demote(job)
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

    def abandon(self, ahead: Ahead | None) -> None:
        """A sequence that ends with its mask in flight: the mask is given up on."""
        if ahead is not None and ahead.job is not None:
            self._pool.demote(ahead.job)

    def mark(self) -> None:
        """Forget the jobs ended so far: call before polling, so that `wait` wakes for a later one."""
        self.finished.clear()

    def wait(self, timeout: float) -> None:
        """Until a job ends after `mark` or `timeout` seconds pass: the nap when no sequence can step."""
        self.finished.wait(timeout)

    def close(self) -> None:
        self._pool.close()
