"""The disk tier's writer: one thread that writes snapshot files (disk.write_atomic) off the
caller's thread, which is the router's event loop, behind a bounded queue.

A put that finds the queue full is dropped, not waited for: the RAM tier still holds the
snapshot, and a wait would stall every HTTP request the loop serves. The writer reports each
outcome to `done(job, size)` (size None when the write failed) and to `events(name)`: "written",
"failed" (an OSError, e.g. a full disk), "dropped" (the queue was full).
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import disk

log = logging.getLogger("fermium.snapshots")

QUEUE_LIMIT = 16                # snapshots waiting for the disk; more are dropped (counted)
DISK_EVENTS = ("written", "failed", "dropped", "evicted")


@dataclass
class Job:
    """One file to write. `arrays` builds the payload in the writer thread (it concatenates KV
    blocks), from arrays that nobody writes to."""

    key: bytes
    path: Path
    pos: int
    meta: dict                                      # the file's index entry: base, blocks, rope_delta
    arrays: Callable[[], list[np.ndarray]]


class DiskWriter:
    def __init__(self, done: Callable[[Job, int | None], None], events: Callable[[str], None]):
        self.done, self.events = done, events
        self.queue: queue.Queue[Job] = queue.Queue(QUEUE_LIMIT)
        self.idle = threading.Condition()
        self.pending = 0                            # jobs queued or being written
        self.thread = threading.Thread(target=self._write_forever, name="snapshot-disk-writer", daemon=True)
        self.thread.start()

    def put(self, job: Job) -> bool:
        """Queue a write; never blocks. False: the queue was full and the write is dropped."""
        with self.idle:
            try:
                self.queue.put_nowait(job)
            except queue.Full:
                self.events("dropped")
                return False
            self.pending += 1
            return True

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write is done; False after `timeout` seconds."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def _write_forever(self) -> None:
        while True:
            job = self.queue.get()
            size = None
            try:
                size = disk.write_atomic(job.path, job.pos, job.key, job.arrays(), job.meta)
            except OSError as exc:                  # the RAM tier still holds it
                log.error("snapshot at position %d not written to disk: %s", job.pos, exc)
                self.events("failed")
            except Exception:                       # a bug in one write must not stop the writer
                log.exception("snapshot at position %d not written to disk", job.pos)
                self.events("failed")
            try:
                self.done(job, size)
                if size is not None:
                    self.events("written")
            except Exception:
                log.exception("snapshot at position %d: its disk index entry failed", job.pos)
            finally:
                with self.idle:
                    self.pending -= 1
                    self.idle.notify_all()
