"""The repack cache's build lock: an flock on a file beside the cache, so that of the processes
that open one model's cache at once (prefill's CPU backend and decode, on a first start), one
builds it while the others wait, then open what it built.

The lock file holds its holder's pid, for the waiters' log line; it is never removed, since a
lock file removed while another process waits on it would let two builders in.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

POLL_S = 0.2
WAIT_LOG_S = 5.0

log = logging.getLogger("fermium.decode")


def lock_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".lock")


def tmp_files(cache: Path) -> list[Path]:
    """The builders' temporary files (repack.build writes `<cache>.tmp.<pid>`)."""
    return list(cache.parent.glob(cache.name + ".tmp.*"))


def _written(cache: Path, pid: str) -> float:
    """GiB that the holder has written so far (its file is sparse until the end: blocks, not size)."""
    try:
        return cache.with_name(f"{cache.name}.tmp.{pid}").stat().st_blocks * 512 / 2**30
    except OSError:
        return 0.0


class LockUnavailable(Exception):
    """The lock file cannot be made (no room, no permission): nor could the cache."""


@contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """Held by one process at a time; the others wait, with a log line every few seconds."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(cache), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LockUnavailable(exc.strerror or str(exc)) from exc
    try:
        t0, last = time.monotonic(), -WAIT_LOG_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now - last >= WAIT_LOG_S:
                    last = now
                    pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    log.info("waiting for process %s, which builds the repack cache %s: %.1f GiB written (%.0f s)",
                             pid, cache, _written(cache, pid), now - t0)
                time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        remove_orphans(cache)                 # under the lock, no other builder is alive
        yield
    finally:
        os.close(fd)                          # and with it the lock


def remove_orphans(cache: Path) -> None:
    """Remove the temporary files of builders that died; call only while holding the lock."""
    for tmp in tmp_files(cache):
        try:
            tmp.unlink()
            log.warning("removed %s, left by a repack cache build that did not finish", tmp)
        except OSError:
            pass


def clean_if_idle(cache: Path) -> None:
    """remove_orphans, where no process holds the lock now (and none is building)."""
    if not tmp_files(cache):
        return
    try:
        fd = os.open(lock_path(cache), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        remove_orphans(cache)
    except OSError:
        pass                                  # a builder holds it
    finally:
        os.close(fd)
