"""The shared tier: snapshots in Redis (or Valkey), seen by every router that names the same store.

Keys, under the namespace `fermium:<model fingerprint>-kv-<kv type>:` (the disk tier's folder name):

    snap:<key hex>          head of a snapshot: msgpack [nonce, chunks, size, blob MAC, head MAC]
    blk:<block key hex>     head of a KV block, the same
    <head>:<nonce>:<i>      the blob's chunks, CHUNK bytes each
    tailbits:<base hex>     bitmap of the tail lengths stored under a block key: the index lookup walks
Only what this deployment signed is used, and the index is read in bounded pieces (redis_trust.py).

A blob's bytes are the disk tier's layout (disk.pack: magic, version, header checksum, payload
checksum), so every byte read is checked as a file is. A snapshot's blob holds the recurrent
state, the logits and the tail's KV; its header names its blocks, and each KV block is one blob
under its chain key, written once and shared by every snapshot with that prefix.

Blobs go in CHUNK-sized SETs in one pipeline, so the server answers other clients between them;
the head is set last (NX), so a reader sees a blob whole or not at all, and the nonce keeps two
writers of one key apart.

The byte budget is the server's (`maxmemory`, `allkeys-lru`): it counts every byte of every
router's writes, and a key it evicts only shortens a hit (lookup tries the next shorter one).

Failure: every call has a timeout; a connection error marks the store down for a backoff
during which calls skip it at once, and the first call that succeeds after it counts a
reconnect (redis_link.py); while it is down, the writer thread pings it too. Nothing here
raises to the caller: lookups answer None and writes are dropped, each counted as a fallback.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, Sequence

import numpy as np

from ..kv_cache import kv_dtype, kv_shape
from ..model.config import ModelConfig
from ..state import STATE_DTYPE, state_specs
from . import disk
from .keys import ROOT, Marks, chain, marks_in, tail_key
from .redis_link import PROBE_S, TIMEOUT_S, Link, StoreDown, pipelined
from .redis_trust import SignedReads, Signer, index_bytes, tails_in

log = logging.getLogger("fermium.snapshots")

CHUNK = 4 << 20                 # bytes per SET
QUEUE_LIMIT = 64                # snapshots waiting for the writer; more are dropped (counted)
MAX_CANDIDATES = 64             # snapshot heads asked for in one lookup, longest first
EVENTS = ("hit", "write", "fallback_lookup", "fallback_store", "reconnect", "up", "down", "rejected")


@dataclass
class Record:
    """One snapshot as the tiers exchange it: the RAM tier's arrays, shared, never written to."""

    key: bytes
    pos: int
    base: bytes
    blocks: list[bytes]                  # chain keys of the full blocks, in order
    recurrent: list[np.ndarray]          # conv..., ssm...
    logits: np.ndarray
    tail_k: list[np.ndarray]
    tail_v: list[np.ndarray]
    rope_delta: int
    kv: dict[bytes, tuple[list[np.ndarray], list[np.ndarray]]]   # block key -> (k, v) per full layer


def namespace(model_id: str, kv_type: str) -> str:
    return f"fermium:{model_id}-kv-{kv_type}:"


class RedisTier(SignedReads):
    """The shared tier of one model and KV type. `put` queues a record for the writer thread;
    `fetch` (blocking: call it off the event loop) returns the longest stored snapshot past a
    position. `events(name)` is told of each of EVENTS. `key` signs and checks every entry
    (redis_trust.derive_key); `ssl` holds redis-py's ssl_* options of a rediss:// URL."""

    def __init__(self, url: str, cfg: ModelConfig, kv_type: str, block: int, model_id: str = "",
                 events: Callable[[str], None] = lambda name: None, timeout: float = TIMEOUT_S, *,
                 key: bytes, ssl: dict | None = None):
        self.cfg, self.kv_type, self.block, self.events = cfg, kv_type, block, events
        self.signer = Signer(key)
        self.ns = namespace(model_id or "model", kv_type)
        # the largest blob: a state of one block (more than a snapshot or a KV block holds), logits, header
        self.max_blob = (sum(int(np.prod(s)) * d.itemsize for _, d, s in state_specs(block, cfg, kv_type))
                         + cfg.vocab_size * 4 + disk.MAX_HEADER + disk.PREFIX.size)
        self.link = Link(url, timeout, events, ssl or {})
        self.queue: queue.Queue[Record | None] = queue.Queue(QUEUE_LIMIT)
        self.idle = threading.Condition()
        self.pending = 0                          # records queued or being written
        self.writer = threading.Thread(target=self._write_forever, name="snapshot-store-writer", daemon=True)
        self.writer.start()
        self.link.check_policy()

    # ---- keys
    def _snap(self, key: bytes) -> str:
        return f"{self.ns}snap:{key.hex()}"

    def _blk(self, key: bytes) -> str:
        return f"{self.ns}blk:{key.hex()}"

    def _tails(self, base: bytes) -> str:
        return f"{self.ns}tailbits:{base.hex()}"

    # ---- writes
    def put(self, record: Record) -> None:
        """Queue a snapshot for the store; never blocks (a full queue drops it, counted)."""
        with self.idle:
            try:
                self.queue.put_nowait(record)
                self.pending += 1
            except queue.Full:
                self.events("fallback_store")

    def flush(self, timeout: float) -> bool:
        """Wait until the writer has nothing left; False after `timeout` seconds."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def close(self) -> None:
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass

    def _write_forever(self) -> None:
        while True:
            try:
                record = self.queue.get(timeout=PROBE_S if self.link.down else None)
            except queue.Empty:
                self.link.probe()
                continue
            if record is None:
                return
            try:
                if self._write(record):
                    self.events("write")
            except StoreDown as exc:
                log.debug("snapshot at %d not written to the store: %s", record.pos, exc)
                self.events("fallback_store")
            except Exception:                     # a store that answers oddly must not stop the writer
                log.exception("snapshot at %d not written to the store", record.pos)
                self.events("fallback_store")
            finally:
                with self.idle:
                    self.pending -= 1
                    self.idle.notify_all()

    def _write(self, r: Record) -> bool:
        """Blocks first, then the snapshot, then its index entry. False: the store had it already."""
        head = self._snap(r.key)
        if self.link.call(lambda c: c.exists(head)):
            return False
        have = self.link.call(lambda c: pipelined(c, [("exists", self._blk(b)) for b in r.blocks]))
        for i, (bkey, present) in enumerate(zip(r.blocks, have)):
            if not present:
                ks, vs = r.kv[bkey]
                parent = r.blocks[i - 1] if i else ROOT
                self._put_blob(self._blk(bkey), *disk.pack((i + 1) * self.block, bkey, [*ks, *vs],
                                                           {"base": parent.hex(), "blocks": [bkey.hex()]}))
        meta = {"base": r.base.hex(), "blocks": [b.hex() for b in r.blocks], "rope_delta": r.rope_delta}
        if not self._put_blob(head, *disk.pack(r.pos, r.key, [*r.recurrent, r.logits, *r.tail_k, *r.tail_v],
                                               meta)):
            return False
        tail = r.pos - len(r.blocks) * self.block
        self.link.call(lambda c: c.setbit(self._tails(r.base), tail, 1))
        return True

    def _put_blob(self, head: str, prefix: bytes, views: list[memoryview]) -> bool:
        data = b"".join([prefix, *views])
        nonce = os.urandom(6).hex()
        names = [f"{head}:{nonce}:{i}" for i in range(max(1, -(-len(data) // CHUNK)))]
        self.link.call(lambda c: pipelined(c, [("set", n, data[i * CHUNK:(i + 1) * CHUNK])
                                                for i, n in enumerate(names)]))
        signed = self.signer.head(head, nonce, len(names), len(data), self.signer.mac(head, b"blob", data))
        if self.link.call(lambda c: c.set(head, signed, nx=True)):
            return True
        self.link.call(lambda c: c.delete(*names))    # another writer's copy came first
        return False

    # ---- reads
    def fetch(self, tokens: Sequence[int], marks: Marks = (), beyond: int = 0,
              have: Callable[[bytes], bool] = lambda key: False) -> Record | None:
        """The longest stored snapshot of a prefix of `tokens` that ends past `beyond`, with the
        KV blocks it needs that `have` (the RAM tier) lacks; None on a miss or when the store
        does not answer (a fallback, counted)."""
        try:
            found = self._fetch(tokens, marks, beyond, have)
        except StoreDown as exc:
            log.debug("snapshot lookup skipped the store: %s", exc)
            self.events("fallback_lookup")
            return None
        except Exception:
            log.exception("snapshot lookup in the store failed; serving from the local tiers")
            self.events("fallback_lookup")
            return None
        if found is not None:
            self.events("hit")
        return found

    def _fetch(self, tokens, marks, beyond, have) -> Record | None:
        B = self.block
        bases = [ROOT, *chain(tokens, B, marks)]
        first = max(0, beyond) // B
        tails = self.link.call(lambda c: pipelined(c, [("getrange", self._tails(b), 0, index_bytes(B) - 1)
                                                        for b in bases[first:]], raise_on_error=False))
        candidates = []                           # longest first; keys hashed for these alone
        for j in range(len(bases) - 1, first - 1, -1):
            for t in tails_in(tails[j - first], B):
                pos = j * B + t
                if beyond < pos <= len(tokens) and len(candidates) < MAX_CANDIDATES:
                    candidates.append((pos, j, tail_key(bases[j], tokens[j * B:pos], marks_in(marks, j * B, pos))))
        if not candidates:
            return None
        heads = self.link.call(lambda c: pipelined(c, [("get", self._snap(k)) for _, _, k in candidates]))
        for (pos, j, key), head in zip(candidates, heads):
            if head is None:
                continue
            record = self._read_snapshot(key, head, pos, bases[1:j + 1], have)
            if record is not None:
                return record
        return None

    def _read_snapshot(self, key: bytes, head: bytes, pos: int, blocks: list[bytes], have) -> Record | None:
        name = PurePosixPath(self._snap(key).replace(":", "/"))
        data = self._get_chunks(self._snap(key), head)
        if data is None:
            return None
        try:
            header, arrays = disk.parse(name, data)
            self._fits_snapshot(name, header, pos, blocks)
        except disk.CorruptSnapshot as exc:
            log.error("dropping a snapshot of the store: %s", exc)
            self.link.call(lambda c: c.delete(self._snap(key)))
            return None
        kv = {}
        for i, bkey in enumerate(blocks):
            if have(bkey):
                continue
            got = self._read_block(bkey, blocks[i - 1] if i else ROOT, i)
            if got is None:
                return None                           # evicted: this snapshot is of no use
            kv[bkey] = got
        n_lin, n_full = len(self.cfg.linear_layers), len(self.cfg.full_layers)
        rest = arrays[2 * n_lin + 1:]
        return Record(key, pos, blocks[-1] if blocks else ROOT, blocks, arrays[:2 * n_lin], arrays[2 * n_lin],
                      rest[:n_full], rest[n_full:], header["meta"].get("rope_delta", 0), kv)

    def _read_block(self, bkey: bytes, parent: bytes, index: int):
        head = self.link.call(lambda c: c.get(self._blk(bkey)))
        data = None if head is None else self._get_chunks(self._blk(bkey), head)
        if data is None:
            return None
        name = PurePosixPath(self._blk(bkey).replace(":", "/"))
        try:
            header, arrays = disk.parse(name, data)
            kt, shape = kv_dtype(self.kv_type), kv_shape(self.block, self.cfg.n_kv_heads, self.cfg.head_dim,
                                                          self.kv_type)
            n_full = len(self.cfg.full_layers)
            if (header["pos"] != (index + 1) * self.block or header["meta"]["base"] != parent.hex()
                    or header["meta"]["blocks"] != [bkey.hex()] or header["specs"] != [(kt, shape)] * (2 * n_full)):
                raise disk.CorruptSnapshot(f"{name}: not the KV block of this model at block {index}")
        except disk.CorruptSnapshot as exc:
            log.error("dropping a KV block of the store: %s", exc)
            self.link.call(lambda c: c.delete(self._blk(bkey)))
            return None
        return arrays[:n_full], arrays[n_full:]

    def _fits_snapshot(self, name, header: dict, pos: int, blocks: list[bytes]) -> None:
        meta = header["meta"]
        if header["pos"] != pos or meta["blocks"] != [b.hex() for b in blocks] \
                or meta["base"] != (blocks[-1] if blocks else ROOT).hex():
            raise disk.CorruptSnapshot(f"{name}: not the snapshot that its key names")
        n_lin = len(self.cfg.linear_layers)
        tail = kv_shape(pos - len(blocks) * self.block, self.cfg.n_kv_heads, self.cfg.head_dim, self.kv_type)
        kt = kv_dtype(self.kv_type)
        want = ([(d, s) for _, d, s in state_specs(pos, self.cfg, self.kv_type)[:2 * n_lin]]
                + [(np.dtype(STATE_DTYPE), (self.cfg.vocab_size,))]
                + [(kt, tail)] * (2 * len(self.cfg.full_layers)))
        if header["specs"] != want:
            raise disk.CorruptSnapshot(f"{name}: its arrays are not this model's state at position {pos}")
