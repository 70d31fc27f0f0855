"""The in-process twin of Dispatcher: the same submit / cancel / forget and the same reply
messages, with a runner called on a thread of this process instead of remote workers.

The caller hands the runner in (anything with the reference model's prefill/decode and
new_state), so the router package itself still loads no kernel. Tests use it to run the
whole HTTP API in one process.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid

from common.protocol.router import Failed, Finished, PrefillDone, Tokens
from common.sampling import Sampler, SamplingParams

from .dispatch import Track
from .schema import Job


class _OneOfEach:
    def count(self, role: str) -> int:
        return 1


class LocalDispatcher:
    def __init__(self, runner):
        self.runner = runner
        self.registry = _OneOfEach()
        self.tracks: dict[str, Track] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()   # one sequence on the runner at a time

    def submit(self, job: Job, stop_ids: tuple[int, ...]) -> Track:
        rid = uuid.uuid4().hex
        track = Track(rid, job.prompt_ids, "local", "local")
        self.tracks[rid] = track
        loop = asyncio.get_running_loop()

        def post(msg) -> None:
            loop.call_soon_threadsafe(track.events.put_nowait, msg)

        threading.Thread(target=self._run, args=(job, stop_ids, rid, post), daemon=True).start()
        return track

    def _run(self, job: Job, stop_ids: tuple[int, ...], rid: str, post) -> None:
        try:
            with self._lock:
                sampler, history = Sampler(SamplingParams(**job.sampling)), list(job.prompt_ids)
                state = self.runner.new_state()
                t0 = time.perf_counter()
                logits = self.runner.prefill(list(job.prompt_ids), state)
                post(PrefillDone(rid, "local", len(job.prompt_ids), time.perf_counter() - t0))
                for n in range(1, job.max_tokens + 1):
                    if rid in self._cancelled:
                        post(Finished(rid, "local", "cancelled", n - 1, state.pos, None, None))
                        return
                    token = sampler.sample(logits, history)
                    if token in stop_ids:
                        post(Finished(rid, "local", "stop", n, state.pos, None, None))
                        return
                    history.append(token)
                    post(Tokens(rid, "local", [token]))
                    if n < job.max_tokens:
                        logits = self.runner.decode([token], [state])[0]
                post(Finished(rid, "local", "length", job.max_tokens, state.pos, None, None))
        except Exception as e:
            post(Failed(rid, "local", f"{type(e).__name__}: {e}"))

    def cancel(self, rid: str, reason: str) -> None:
        self._cancelled.add(rid)

    def forget(self, rid: str) -> None:
        self.tracks.pop(rid, None)
