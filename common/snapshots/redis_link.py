"""The shared tier's connection to Redis: a timeout on every call, and the down state with its backoff.

A connection error marks the store down for a backoff (BACKOFF_MIN_S doubling to BACKOFF_MAX_S)
during which calls raise StoreDown at once, without touching the network; the first call that
succeeds after it reports a reconnect. redis-py's own retries are off, so a call never takes
longer than its timeouts.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("fermium.snapshots")

TIMEOUT_S = 1.0                 # every socket operation
BACKOFF_MIN_S = 0.25
BACKOFF_MAX_S = 5.0
READ_SIZE = 1 << 20             # bytes per socket read: blobs are megabytes
PROBE_S = 0.25                  # how often a store that is down is looked at, when nothing else calls it


def redacted(url: str) -> str:
    """The URL without its password, for logs."""
    parsed = urlsplit(url)
    if parsed.password is None:
        return url
    netloc = f"{parsed.username or ''}:***@{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "")
    return urlunsplit(parsed._replace(netloc=netloc))


class StoreDown(Exception):
    """The store did not answer (or is in its backoff); the caller falls back."""


class Link:
    """The client, with the down/backoff state; thread-safe (redis-py's pool gives each thread a connection)."""

    def __init__(self, url: str, timeout: float, events: Callable[[str], None], ssl: dict):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        self.errors = (redis.ConnectionError, redis.TimeoutError, OSError)
        self.response_error = redis.ResponseError
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                           health_check_interval=0, socket_read_size=READ_SIZE, **ssl)
        self.url, self.events = redacted(url), events       # the URL as logs show it
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.retry_at = 0.0
        self.backoff = BACKOFF_MIN_S

    def call(self, fn: Callable):
        """fn(client), or StoreDown when the store is in its backoff or does not answer."""
        with self.lock:
            if self.down_since is not None and time.monotonic() < self.retry_at:
                raise StoreDown(f"{self.url} is down; next try in {self.retry_at - time.monotonic():.1f} s")
        try:
            result = fn(self.client)
        except self.errors as exc:
            self._failed(exc)
            raise StoreDown(f"{self.url}: {exc}") from exc
        with self.lock:
            came_back, self.down_since, self.backoff = self.down_since is not None, None, BACKOFF_MIN_S
        if came_back:
            log.warning("snapshot store %s answers again", self.url)
            self.events("reconnect")
            self.events("up")
        return result

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def probe(self) -> None:
        """Ping a store that is down, once its backoff is over, so that it is seen back even while
        every request is served from RAM."""
        try:
            self.call(lambda c: c.ping())
        except StoreDown:
            pass

    def check_policy(self) -> None:
        """Warn when the server has no byte budget with LRU eviction, which the shared tier relies on."""
        try:
            cfg = self.call(lambda c: c.config_get("maxmemory*"))
        except (StoreDown, self.response_error) as exc:   # down, or CONFIG renamed away: not ours to fix
            log.warning("snapshot store %s: cannot read its memory policy (%s)", self.url, exc)
            return
        self.events("up")
        if cfg.get("maxmemory-policy") != "allkeys-lru" or cfg.get("maxmemory") in ("0", None):
            log.warning("snapshot store %s has maxmemory %s, policy %s; give it a byte budget with "
                        "allkeys-lru (deploy/README.md), or it fills and refuses writes", self.url,
                        cfg.get("maxmemory"), cfg.get("maxmemory-policy"))

    def _failed(self, exc: Exception) -> None:
        with self.lock:
            first = self.down_since is None
            if first:
                self.down_since = time.monotonic()
            else:
                self.backoff = min(BACKOFF_MAX_S, self.backoff * 2)
            self.retry_at = time.monotonic() + self.backoff
        self.client.connection_pool.disconnect()      # sockets of a dead server: start afresh
        if first:
            log.error("snapshot store %s is down (%s); serving from the local tiers", self.url, exc)
            self.events("down")


def pipelined(client, commands: list[tuple], raise_on_error: bool = True) -> list:
    """The commands in one round trip, without MULTI: the server serves other clients between them.
    raise_on_error False: a command's error (e.g. a key of another type) is its result instead."""
    pipe = client.pipeline(transaction=False)
    for name, *args in commands:
        getattr(pipe, name)(*args)
    return pipe.execute(raise_on_error=raise_on_error)
