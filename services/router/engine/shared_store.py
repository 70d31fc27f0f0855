"""The router's side of the shared snapshot tier (--snapshot-store, common/snapshots/redis_tier.py).

`SharedSnapshotCache` is the SnapshotCache whose store has a shared tier: before a request is
dispatched, `prefetch` asks the shared tier, on a thread of its own, for a prefix longer than
the local tiers hold, and waits for it at most PREFETCH_DEADLINE_S, so a slow or dead store
delays a request by that much at worst and never fails it. The tier's events become the
router's fermium_snapshot_store_* metrics.

The store is not trusted (common/snapshots/redis_trust.py): entries are signed with the
deployment's secret, --snapshot-key or else the worker token, so every router of one store
needs the same one. A rediss:// URL speaks TLS, checked against --snapshot-store-ca.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from ipaddress import ip_address
from typing import Sequence
from urllib.parse import urlparse

from common.errors import UserError
from common.metrics import RouterMetrics
from common.model.config import ModelConfig
from common.snapshots import SnapshotStore
from common.snapshots.keys import Marks
from common.snapshots.redis_link import redacted
from common.snapshots.redis_tier import RedisTier
from common.snapshots.redis_trust import derive_key
from common.worker_token import resolve as resolve_token

from .prefix_cache import SnapshotCache

log = logging.getLogger("fermium.router")

PREFETCH_DEADLINE_S = 2.0
PREFETCH_THREADS = 4
SCHEMES = ("redis", "rediss", "unix")


class StoreAddressError(UserError, ValueError):
    """A --snapshot-store that is not a Redis URL."""


def check_store_url(url: str, ca: str | None = None, cert: str | None = None) -> dict:
    """redis-py's ssl_* options for the store at `url`; StoreAddressError for what cannot work."""
    parsed = urlparse(url)
    if parsed.scheme not in SCHEMES or not (parsed.hostname or parsed.path):
        raise StoreAddressError(f"--snapshot-store {redacted(url)!r}: give redis://HOST:PORT/DB (or rediss://, "
                                f"unix://)")
    if parsed.scheme != "rediss":
        if ca or cert:
            raise StoreAddressError(f"--snapshot-store-ca and --snapshot-store-cert need a rediss:// (TLS) "
                                    f"--snapshot-store, not {redacted(url)!r}")
        if parsed.scheme == "redis" and not _loopback(parsed.hostname):
            log.warning("the snapshot store %s is reached without TLS; on a network you do not trust, use "
                        "rediss:// with --snapshot-store-ca (deploy/README.md)", redacted(url))
        return {}
    return {k: v for k, v in (("ssl_ca_certs", ca), ("ssl_certfile", cert)) if v}


def _loopback(host: str | None) -> bool:
    try:
        return host == "localhost" or ip_address(host or "").is_loopback
    except ValueError:
        return False


def store_key(snapshot_key: str | None, worker_token: str | None) -> bytes:
    """The MAC key of the shared tier: --snapshot-key's, else the worker token's (as the dispatcher resolves it)."""
    return derive_key(snapshot_key or resolve_token(worker_token))


def tier_events(metrics: RouterMetrics):
    """The RedisTier's events as metric updates."""
    def event(name: str) -> None:
        if name == "hit":
            metrics.store_hits.inc()
        elif name == "write":
            metrics.store_writes.inc()
        elif name.startswith("fallback_"):
            metrics.store_fallbacks.labels(name.removeprefix("fallback_")).inc()
        elif name == "reconnect":
            metrics.store_reconnects.inc()
        elif name in ("up", "down"):
            metrics.store_up.set(name == "up")
        elif name == "rejected":
            metrics.store_rejected.inc()
    return event


class SharedSnapshotCache(SnapshotCache):
    def __init__(self, cfg: ModelConfig, store: SnapshotStore, metrics: RouterMetrics, snapshot_every: int):
        super().__init__(cfg, store, metrics, snapshot_every)
        metrics.store_queue.set_function(lambda: store.shared.pending)
        self._pool = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="snapshot-prefetch")

    async def prefetch(self, ids: Sequence[int], marks: Marks = ()) -> int:
        """Bring a longer prefix of `ids` from the shared tier into RAM; the position, or 0. Never raises
        but for cancellation: a store that is slow past the deadline counts a fallback."""
        work = asyncio.get_running_loop().run_in_executor(self._pool, self.store.prefetch, list(ids), marks)
        try:
            return await asyncio.wait_for(asyncio.shield(work), PREFETCH_DEADLINE_S)
        except TimeoutError:
            log.warning("the snapshot store took over %g s; this request starts from the local tiers",
                        PREFETCH_DEADLINE_S)
            self.metrics.store_fallbacks.labels("lookup").inc()
        except Exception:
            log.exception("prefetch from the snapshot store failed; serving from the local tiers")
            self.metrics.store_fallbacks.labels("lookup").inc()
        return 0


def shared_cache(cache: SnapshotCache, url: str, model_id: str, metrics: RouterMetrics, key: bytes,
                 ca: str | None = None, cert: str | None = None) -> SharedSnapshotCache:
    """`cache` with the shared tier at `url` behind its store, its entries signed with `key` (store_key)."""
    store = cache.store
    store.shared = RedisTier(url, store.cfg, store.kv_type, store.block, model_id, tier_events(metrics),
                             key=key, ssl=check_store_url(url, ca, cert))
    log.info("snapshots: shared tier %s (namespace %s)", store.shared.link.url, store.shared.ns)
    return SharedSnapshotCache(cache.cfg, store, metrics, cache.snapshot_every)
