"""A decode step's tokens (common.protocol.router.DecodeStep) to the tracks of its sequences, one
Tokens each: the router's receiving end of what vLLM calls EngineCoreOutputs."""
from __future__ import annotations

import logging
from typing import Callable

from common.log_limit import LogLimiter
from common.metrics import RouterMetrics
from common.protocol.router import DecodeStep

from .track import Track

log = logging.getLogger("fermium.router")
_refused = LogLimiter(log, "router: refused decode tokens")


def deliver(msg: DecodeStep, tracks: dict[str, Track], metrics: RouterMetrics, cancel: Callable[[str, str], None],
            orphan: Callable[[str, str], None]) -> None:
    """Each entry to its track; one of a request that ended here, orphan(rid, worker_id), for the
    worker to stop it; one of a request another worker decodes is refused, logged and counted."""
    for seq in msg.seqs:
        track = tracks.get(seq.rid)
        if track is None:
            orphan(seq.rid, msg.worker_id)
        elif track.decode != msg.worker_id:
            metrics.protocol_error("invalid")
            _refused("router refused tokens of request %.40s from decode worker %.40s: worker %.40s decodes it",
                     seq.rid, msg.worker_id, track.decode)
        else:
            track.generated.extend(seq.tokens)
            track.events.offer(seq, metrics, cancel)     # past its bound: ended as a stalled client
