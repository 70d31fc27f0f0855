"""Liveness as progress, without processes: the router's StallWatch on a fake clock, the worker's
exit on a refusal after registration, the test hook's one shot, and the retryable error."""
from __future__ import annotations

import threading

from common.liveness import HANG_ENV, hang_hook
from services.router.engine import Drained, GenerationError, Stalled
from services.router.engine.liveness import TELL_EVERY_S, StallFailed, StallWatch
from services.router.engine.workers import Worker
from services.router.frontend.errors import failure

TIMEOUT = 5.0


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def worker(wid: str = "decode-00000001", address: str = "tcp://127.0.0.1:1") -> Worker:
    return Worker(wid, wid.split("-")[0], address, 4, "m", None, 0.0)


def watch() -> tuple[StallWatch, Clock, dict[str, Worker]]:
    clock = Clock()
    w = worker()
    return StallWatch(TIMEOUT, forget_after=2.5, clock=clock), clock, {w.worker_id: w}


def test_a_busy_worker_whose_steps_stay_put_stalls_after_the_timeout():
    sw, clock, workers = watch()
    sw.beat("decode-00000001", 7, True)
    clock.now += TIMEOUT - 0.1
    sw.beat("decode-00000001", 7, True)
    assert sw.check(workers) == []
    clock.now += 0.2
    assert [w.worker_id for w in sw.check(workers)] == ["decode-00000001"]
    (entry,) = sw.report()
    assert entry["id"] == "decode-00000001" and entry["role"] == "decode" and entry["steps"] == 7
    assert sw.check(workers) == []            # reported once; the caller removes it


def test_moving_steps_or_no_work_never_stall():
    sw, clock, workers = watch()
    for i in range(20):                       # busy, and advancing
        sw.beat("decode-00000001", i, True)
        clock.now += 1.0
        assert sw.check(workers) == []
    for _ in range(20):                       # stuck, but idle: a loop waiting for work
        sw.beat("decode-00000001", 19, False)
        clock.now += 1.0
        assert sw.check(workers) == []
    sw.beat("decode-00000001", 19, True)      # work came: the clock starts now, not at the last move
    clock.now += TIMEOUT - 0.5
    assert sw.check(workers) == []


def test_a_stalled_worker_is_held_until_its_steps_move_and_told_at_a_bounded_rate():
    sw, clock, workers = watch()
    sw.beat("decode-00000001", 3, True)
    clock.now += TIMEOUT + 1
    sw.check(workers)
    assert sw.held("decode-00000001", 3) and sw.tell("decode-00000001")
    clock.now += 0.5
    assert sw.held("decode-00000001", 3) and not sw.tell("decode-00000001")
    clock.now += TELL_EVERY_S
    assert sw.held("decode-00000001", 3) and sw.tell("decode-00000001")
    assert not sw.held("decode-00000001", 4)   # its loop came back: it may register again
    assert sw.report() == [] and not sw.held("decode-00000001", 3)


def test_a_stalled_worker_is_forgotten_when_restarted_or_silent():
    sw, clock, workers = watch()
    sw.beat("decode-00000001", 3, True)
    clock.now += TIMEOUT + 1
    sw.check(workers)
    sw.replaced("tcp://127.0.0.1:1")          # a new worker registered at its address
    assert sw.report() == []
    sw.beat("decode-00000001", 3, True)
    clock.now += TIMEOUT + 1
    sw.check(workers)
    clock.now += 3.0                          # no heartbeat since: it exited
    sw.check({})
    assert sw.report() == []


def test_timeout_zero_is_off():
    clock = Clock()
    sw = StallWatch(0.0, forget_after=2.5, clock=clock)
    sw.beat("decode-00000001", 1, True)
    clock.now += 1e6
    assert sw.check({"decode-00000001": worker()}) == []


def test_a_stalled_workers_requests_fail_with_a_retryable_503():
    err = failure(Stalled("decode worker stalled; retry the request"))
    assert err.status == 503 and err.headers.get("Retry-After") and err.code == "worker_stalled"
    assert failure(Drained("draining")).code == "shutting_down"
    assert failure(GenerationError("lost")).status == 500
    assert isinstance(StallFailed("r", "decode-00000001", "why"), StallFailed)


def test_the_hang_hook_is_inert_without_its_variable_and_fires_once(tmp_path):
    assert hang_hook("decode", environ={}) is None
    path = tmp_path / "hang"
    path.write_text("prefill")
    hook = hang_hook("decode", environ={HANG_ENV: str(path)})
    hook()                                    # another role's: nothing happens
    assert path.exists()
    path.write_text("decode")
    t = threading.Thread(target=hook, daemon=True)
    t.start()
    t.join(5)
    assert t.is_alive() and not path.exists() and float((tmp_path / "hang.hung").read_text()) > 0
    hook()                                    # the file is gone: a second request passes
