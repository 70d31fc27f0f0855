"""The router's side of the wire: sends requests to workers, routes their replies to the waiting
HTTP handlers, and ends the requests of a worker whose connection drops, whose host vanishes (no
heartbeat) or whose compute loop stalls (liveness.py, retryable). Workers join through
enrolment.py. Messages arrive on the inbox's IO thread and are handed to the event loop, where
everything here runs, so no lock is needed. Each request gets a Track (track.py); n > 1 choices
share one prefill (copies.py); prefix_cache.py looks prefixes up, placement.py places prefill,
snapshot_chains.py assembles each Snapshot from the KV rows it brings, and finals.py a final state.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from common.kv_cache import DEFAULT_KV_TYPE
from common.log_limit import LogLimiter
from common.metrics import RouterMetrics
from common.mp import PullQueue, PushQueue
from common.mp_local import pull_queue, push_queue
from common.protocol import Message, ProtocolError
from common.protocol.codec import WireLimits
from common.protocol.prefill import PrefillRequest
from common.protocol.router import DecodeStep, Failed, Finished, Heartbeat, Hello, NotHeld, PrefillDone, Snapshot
from common.protocol.worker import Cancel
from common.worker import CancelledIds
from common.worker_token import matches
from common.worker_token import resolve as resolve_token

from .copies import Copies, CopySends, snapshot_every
from .decode_room import DecodeRoom
from .decode_steps import deliver
from .enrolment import Enrolment
from .errors import NoWorkers
from .finals import FinalStates
from .liveness import StallFailed, StallWatch
from .placement import Placement
from .prefix_cache import NoPrefixCache, PrefixCache
from .request import Request
from .snapshot_chains import SnapshotChains, SnapshotIntake
from .track import Track
from .workers import MAX_PER_ROLE, ROLES, Worker, WorkerRegistry

log = logging.getLogger("fermium.router")

REAP_INTERVAL_S = 0.25
ENROL_SLICE_S = 0.005          # the loop serves other work at least this often through a flood of Hellos


class Dispatcher(SnapshotIntake, CopySends, FinalStates):
    def __init__(self, address: str, *, heartbeat_timeout: float, metrics: RouterMetrics,
                 cache: PrefixCache | None = None, token: str | None = None, max_workers: int = MAX_PER_ROLE,
                 limits: WireLimits | None = None, kv_type: str = DEFAULT_KV_TYPE, stall_timeout: float = 0.0):
        self.address, self.kv_type, self.limits, self.metrics = address, kv_type, limits, metrics
        self.cache = cache or NoPrefixCache()
        self.token = resolve_token(token)
        self.registry = WorkerRegistry(heartbeat_timeout, self._connect, max_per_role=max_workers)
        self.placement = Placement(metrics)
        self.room = DecodeRoom(self.registry, lambda n: NoWorkers(
            f"no decode worker is connected; start one with `fermium decode --router {address}`"))
        self.liveness = StallWatch(stall_timeout, forget_after=heartbeat_timeout)
        self.tracks: dict[str, Track] = {}
        self.copies: dict[str, Copies] = {}     # rid of a copy 0 -> the copies waiting for its prefill
        self.chains = SnapshotChains()          # rid of a prefill -> the KV its Snapshots extend
        self._refusals = LogLimiter(log, "refused Snapshots")
        self.inbox: PullQueue | None = None
        self._reaper: asyncio.Task | None = None
        self._joining: asyncio.Queue = asyncio.Queue()     # Hellos and Heartbeats, for _enrol_forever
        self._enroller: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.enrolment = Enrolment(self.registry, metrics, self.token, kv_type)
        self._orphans = CancelledIds()

    def _connect(self, address: str) -> PushQueue:
        link = None

        def lost() -> None:                    # on the link's IO thread
            try:
                self._loop.call_soon_threadsafe(self._link_lost, link)
            except RuntimeError:               # the loop is closed: the router is stopping
                pass

        link = push_queue(address, name=f"router->{address}", on_disconnect=lost)   # `lost` reads it
        return link

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.inbox = pull_queue(self.address, name="router",
                               on_message=lambda m: loop.call_soon_threadsafe(self._arrived, m),
                               on_error=lambda e: loop.call_soon_threadsafe(self._rejected, e),
                               limits=self.limits, errors=self.metrics.protocol_error)
        self._reaper = asyncio.create_task(self._reap_forever())
        self._enroller = asyncio.create_task(self._enrol_forever())
        log.info("router: workers register at %s", self.inbox.address)

    async def close(self) -> None:
        for task in (self._reaper, self._enroller):
            if task:
                task.cancel()
        if self.inbox:
            self.inbox.close()
        self.registry.close()

    # ---- requests
    def submit(self, job: Request, stop_ids: tuple[int, ...]) -> Track:
        return self.submit_copies(job, stop_ids, 1)[0]

    def submit_copies(self, job: Request, stop_ids: tuple[int, ...], n: int) -> list[Track]:
        """`n` copies of the job, copy i sampling with job.sampling.for_choice(i); one prefill for all."""
        decode = self.registry.pick("decode")
        for role, w in (("prefill", self.registry.count("prefill")), ("decode", decode)):
            if not w:
                raise NoWorkers(f"no {role} worker is connected; start one with "
                                f"`fermium {role} --router {self.address}`")
        images = job.images
        marks = images.marks() if images else []
        # a cache without images keeps its signature; prefill resumes before or after an image, never inside
        start, state, logits = self.cache.lookup(job.prompt_ids, marks) if marks else self.cache.lookup(job.prompt_ids)
        if images and images.inside(start):
            start, state, logits = 0, None, None
        delta = images.rope_delta(start) if images else 0
        whole = start == len(job.prompt_ids)             # cached whole: straight to decode
        history, stops, keep = list(job.prompt_ids), list(stop_ids), self.cache.wants_final_state
        plan = None if whole else self.placement.plan(self.registry.workers.values(), job.prompt_ids, start, state,
                                                      keep and not marks)
        tracks = []
        for i in range(n):
            w = decode if i == 0 else self.registry.pick("decode") or decode
            track = Track(uuid.uuid4().hex, job.prompt_ids, "" if whole else plan.worker.worker_id, w.worker_id)
            track.cached, track.marks, track.hold = start, marks, bool(plan and plan.hold)
            self.tracks[track.rid] = track
            w.inflight.add(track.rid)
            tracks.append(track)
        pending = Copies(tracks, [job.sampling.for_choice(i) for i in range(n)], history, job.max_tokens, stops, keep)
        if whole:
            self._send_copies(pending, state, logits, delta)
            return tracks
        rid = tracks[0].rid
        every = snapshot_every(self.cache.snapshot_every, len(history), n)
        plan.worker.inflight.add(rid)
        if every:
            self.chains.begin(rid, plan.worker.worker_id, len(history), self.kv_type,
                              self.cache.start_parts(job.prompt_ids, start, state, marks))
        pixels = images.after(start) if images else []
        req = PrefillRequest(rid, history[start:], history, start, decode.address, pending.sampling[0], job.max_tokens,
                             stops, keep, None if plan.held else state, every, self.kv_type, delta, pixels or None,
                             images.image_token if images else -1, plan.held, plan.hold)
        self.placement.send(plan.worker, req, state, plan.key)
        if n > 1:
            pending.tracks, pending.sampling = tracks[1:], pending.sampling[1:]
            self.copies[rid] = pending
        return tracks

    def cancel(self, rid: str, reason: str) -> None:
        track = self.tracks.get(rid)
        if track is None:
            return
        for wid in (track.prefill, track.decode):
            w = self.registry.workers.get(wid)
            if w is not None:
                w.link.put(Cancel(rid, reason))

    def forget(self, rid: str) -> None:
        track = self.tracks.pop(rid, None)
        self.placement.done(rid, False)
        for key in [k for k, c in self.copies.items() if k not in self.tracks
                    and not any(t.rid in self.tracks for t in c.tracks)]:
            del self.copies[key]
            self.chains.end(key)
        if rid not in self.copies:              # else its Snapshot is still to come for them
            self.chains.end(rid)
        if track is None:
            return
        for wid in (track.prefill, track.decode):
            w = self.registry.workers.get(wid)
            if w is not None:
                w.inflight.discard(rid)
        self.room.wake()

    # ---- replies (on the event loop)
    def _arrived(self, msg: Message) -> None:
        if isinstance(msg, (Hello, Heartbeat)):
            self._joining.put_nowait(msg)
        else:
            self._handle(msg)

    async def _enrol_forever(self) -> None:       # each connects a socket: a flood must not stall requests
        while True:
            msg, start = await self._joining.get(), time.monotonic()
            while msg is not None:
                try:
                    self._hello(msg)
                except Exception:                  # one bad registration never stops the others
                    log.exception("router: registering a worker failed")
                more = not self._joining.empty() and time.monotonic() - start < ENROL_SLICE_S
                msg = self._joining.get_nowait() if more else None
            await asyncio.sleep(0)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, DecodeStep):
            return deliver(msg, self.tracks, self.metrics, self.cancel, self._cancel_orphan)
        if isinstance(msg, Snapshot):          # snapshot_chains.py
            self._snapshot(msg)
            return
        track = self.tracks.get(msg.rid)
        if track is None:   # a request that already ended, or one of the router before a restart
            return
        if isinstance(msg, NotHeld):           # its worker is gone when nothing is resent: its requests fail
            self.placement.resend(self.registry.workers.get(track.prefill), msg.rid)
            return
        if isinstance(msg, (PrefillDone, Failed)):
            self.chains.end(msg.rid)
            self._fail_copies(msg.rid, msg.error if isinstance(msg, Failed) else "the prefill sent no state to copy")
            self.placement.done(msg.rid, isinstance(msg, PrefillDone))
        if isinstance(msg, PrefillDone):
            w = self.registry.workers.get(track.prefill)
            if w is not None:
                w.inflight.discard(msg.rid)
        elif isinstance(msg, Finished):        # finals.py
            self._final(track, msg)
        elif not isinstance(msg, Failed):
            log.error("router got an unexpected %s (rid %s); ignored", type(msg).__name__, msg.rid)
            return
        track.events.offer(msg, self.metrics, self.cancel)     # past its bound: ended as a stalled client

    def _cancel_orphan(self, rid: str, worker_id: str) -> None:
        w = self.registry.workers.get(worker_id)
        if w is None or rid in self._orphans:
            return
        self._orphans.add(rid)
        w.link.put(Cancel(rid, "the router holds no such request"))

    def _hello(self, msg: Hello | Heartbeat) -> None:
        stuck = isinstance(msg, Heartbeat) and matches(msg.token, self.token)
        if stuck and self.liveness.held(msg.worker_id, msg.steps):
            if self.liveness.tell(msg.worker_id):      # it exits on this, for its supervisor to restart it
                self.enrolment.refusal_ack(msg, "its compute loop stalled", self._loop)
            return
        replaced = self.enrolment.admit(msg, self._loop)
        self.room.wake()                       # a heartbeat's count, or a new worker's room
        if isinstance(msg, Heartbeat) and msg.worker_id in self.registry.workers:
            self.liveness.beat(msg.worker_id, msg.steps, msg.busy)
        if replaced is None:
            return
        self.liveness.replaced(msg.address)
        for w in replaced:
            self._fail_all(w, f"{w.role} worker {w.worker_id} at {w.address} was restarted")
        self._gauges()

    def _rejected(self, err: ProtocolError) -> None:
        for rid in err.rids:                   # the inbox has logged it, at a bounded rate
            if rid in self.tracks:
                self.tracks[rid].events.put_nowait(Failed(rid, "", f"router rejected a reply: {err}"))
                self._fail_copies(rid, f"router rejected a reply: {err}")

    def _fail_all(self, w: Worker, why: str, end: type[Failed] = Failed) -> None:
        self.chains.drop_worker(w.worker_id)
        for rid in list(w.inflight):
            if rid in self.tracks:
                self.tracks[rid].events.put_nowait(end(rid, w.worker_id, why))
            self._fail_copies(rid, why)

    def _link_lost(self, link: PushQueue | None) -> None:
        w = self.registry.remove(link, "its connection closed")
        if w is None:
            return                             # a link already replaced or reaped
        log.error("%s worker %s at %s went away (its connection closed); ending its %d requests",
                  w.role, w.worker_id, w.address, len(w.inflight))
        self._fail_all(w, f"{w.role} worker {w.worker_id} at {w.address} stopped responding (its connection closed)")
        self._gauges()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            for w in self.registry.reap():
                log.error("%s worker %s at %s stopped sending heartbeats; ending its %d requests",
                          w.role, w.worker_id, w.address, len(w.inflight))
                self._fail_all(w, f"{w.role} worker {w.worker_id} at {w.address} stopped responding "
                                  f"(no heartbeat for {self.registry.timeout:g} s)")
                self._gauges()
            for w in self.liveness.check(self.registry.workers):
                why = f"its compute loop made no progress for {self.liveness.timeout:g} s while it had work"
                self.registry.remove(w.link, why)
                log.error("%s worker %s at %s stalled (%s); ending its %d requests, refusing its heartbeats",
                          w.role, w.worker_id, w.address, why, len(w.inflight))
                self._fail_all(w, f"{w.role} worker {w.worker_id} at {w.address} stalled ({why}); retry the "
                                  "request", StallFailed)
                self._gauges()

    def _gauges(self) -> None:
        self.room.wake()                       # a worker came or went
        for role in ROLES:
            self.metrics.workers.labels(role).set(self.registry.count(role))
