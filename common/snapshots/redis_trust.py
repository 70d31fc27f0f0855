"""What the shared tier trusts of Redis: only what a router of this deployment signed.

Anyone who reaches the store can write to it, and a blob's own checksums (disk.py) are unkeyed:
a forged blob re-packed with fresh ones checks out. So every head and blob carries a keyed MAC
(BLAKE2b keyed with the deployment's secret: --snapshot-key, else one derived from the worker
token), over the Redis key it is stored under, so that a genuine entry copied under another key
fails too. A head (msgpack [nonce, chunks, size, blob MAC, head MAC]) is checked before its
chunks are read, so a forged head costs one small GET.

The tail index of a block key is a bitmap of BLOCK bits (bit t: a snapshot ends t tokens past
the block), read with a bounded GETRANGE: junk written to it, however much, is never read past
those bits, and a key of another type reads as empty.
"""
from __future__ import annotations

import hashlib
import hmac
import logging

import msgpack

from .redis_link import pipelined

log = logging.getLogger("fermium.snapshots")

MAC_BYTES = 32
PERSON = b"fermium-snapshot"                 # BLAKE2b's personalisation: keys made here serve this alone


def derive_key(secret: str) -> bytes:
    """The MAC key of a deployment secret (a --snapshot-key or the worker token)."""
    if not secret:
        raise ValueError("the shared snapshot tier needs a secret: --snapshot-key or a worker token")
    return hashlib.blake2b(secret.encode(), digest_size=MAC_BYTES, person=PERSON).digest()


class Signer:
    def __init__(self, key: bytes):
        self.key = key

    def mac(self, name: str, *parts: bytes) -> bytes:
        h = hashlib.blake2b(key=self.key, digest_size=MAC_BYTES)
        h.update(name.encode() + b"\0")
        for p in parts:
            h.update(p)
        return h.digest()

    def head(self, name: str, nonce: str, chunks: int, size: int, blob_mac: bytes) -> bytes:
        body = msgpack.packb([nonce, chunks, size, blob_mac])
        return msgpack.packb([nonce, chunks, size, blob_mac, self.mac(name, b"head", body)])

    def open_head(self, name: str, raw: bytes) -> tuple[str, int, int, bytes]:
        """(nonce, chunks, size, blob MAC) of a head signed under `name`; ValueError if it is not one."""
        try:
            fields = msgpack.unpackb(raw)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError("unreadable head") from exc
        if not (isinstance(fields, list) and len(fields) == 5 and isinstance(fields[0], str)
                and type(fields[1]) is int and type(fields[2]) is int
                and all(isinstance(f, bytes) and len(f) == MAC_BYTES for f in fields[3:])):
            raise ValueError("not a head of this format")
        nonce, chunks, size, blob_mac, head_mac = fields
        body = msgpack.packb([nonce, chunks, size, blob_mac])
        if not hmac.compare_digest(self.mac(name, b"head", body), head_mac):
            raise ValueError("its MAC does not check out")
        return nonce, chunks, size, blob_mac

    def check(self, name: str, data: bytes, blob_mac: bytes) -> bool:
        return hmac.compare_digest(self.mac(name, b"blob", data), blob_mac)


class SignedReads:
    """Mixed into RedisTier, whose link, signer, max_blob and events these use."""

    def _get_chunks(self, head_key: str, head: bytes) -> bytes | None:
        """The blob of a head, both checked; None when a chunk is gone (evicted) or they do not check out."""
        try:
            nonce, n, size, blob_mac = self.signer.open_head(head_key, head)
            if not (0 < size <= self.max_blob and 0 < n <= size):
                raise ValueError(f"it asks for {size} bytes in {n} chunks")
            names = [f"{head_key}:{nonce}:{i}" for i in range(n)]
        except ValueError as exc:
            return self._reject(head_key, f"head: {exc}")
        chunks = self.link.call(lambda c: pipelined(c, [("get", name) for name in names]))
        if any(not isinstance(c, bytes) for c in chunks):
            return None                               # a chunk evicted: the blob is gone
        data = b"".join(chunks)
        if len(data) != size or not self.signer.check(head_key, data, blob_mac):
            return self._reject(head_key, "the blob's MAC does not check out")
        return data

    def _reject(self, head_key: str, why: str) -> None:
        """Drop and count an entry that no router of this deployment wrote (forged, damaged, another key's)."""
        log.error("dropping %s of the snapshot store: %s (forged, damaged or another --snapshot-key's)", head_key, why)
        self.events("rejected")
        self.link.call(lambda c: c.delete(head_key))


def index_bytes(block: int) -> int:
    """The bytes of a tail index: one bit per tail length."""
    return -(-block // 8)


def tails_in(raw, block: int) -> list[int]:
    """The tail lengths set in a GETRANGE of an index, longest first; anything else reads as none."""
    if not isinstance(raw, bytes):
        return []                                # an error (a key of another type) or nothing
    return [t for t in range(min(block, 8 * len(raw)) - 1, -1, -1) if raw[t // 8] & (0x80 >> (t % 8))]
