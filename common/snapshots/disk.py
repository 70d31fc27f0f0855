"""The disk tier: one self-contained file per snapshot, checksummed and written atomically.

File layout (little-endian):
    magic  b"FRMSNAP\\0"   8 bytes
    version              u32 (FORMAT_VERSION)
    header_len           u32, then a msgpack header:
        {"pos", "key" (hex), "meta" (the index entry: base key, tail length, block chain),
         "arrays": [[dtype, shape], ...], "checksum": blake2b-256 of the payload}
    payload              the arrays' bytes back to back, in header order

A file whose magic, version, length or checksum does not match is rejected, logged and removed.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from pathlib import Path

import msgpack
import numpy as np

log = logging.getLogger("fermium.snapshots")
MAGIC = b"FRMSNAP\0"
FORMAT_VERSION = 1


class CorruptSnapshot(ValueError):
    pass


def write_atomic(path: Path, pos: int, key: bytes, arrays: list[np.ndarray], meta: dict) -> int:
    """Write, fsync, rename, fsync the directory. Returns the file size."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    digest = hashlib.blake2b(digest_size=32)
    for a in arrays:
        digest.update(memoryview(a).cast("B"))
    header = msgpack.packb({"pos": pos, "key": key.hex(), "meta": meta, "checksum": digest.hexdigest(),
                            "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]})
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header)
        for a in arrays:
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path.stat().st_size


def _header(path: Path, data: bytes) -> tuple[dict, int]:
    if len(data) < 16 or data[:8] != MAGIC:
        raise CorruptSnapshot(f"{path}: bad magic")
    version, header_len = struct.unpack_from("<II", data, 8)
    if version != FORMAT_VERSION:
        raise CorruptSnapshot(f"{path}: format version {version}, expected {FORMAT_VERSION}")
    try:
        header = msgpack.unpackb(data[16:16 + header_len])
        header["specs"] = [(np.dtype(d), tuple(s)) for d, s in header["arrays"]]
        return header, 16 + header_len
    except Exception as exc:
        raise CorruptSnapshot(f"{path}: unreadable header ({exc})") from exc


def read_header(path: Path) -> dict:
    """The header alone (for indexing at start-up); the payload is checked when it is read."""
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16:
            raise CorruptSnapshot(f"{path}: truncated")
        return _header(path, head + f.read(struct.unpack_from("<I", head, 12)[0]))[0]


def read_checked(path: Path) -> tuple[dict, list[np.ndarray]]:
    """(header, arrays), or CorruptSnapshot with the reason."""
    data = path.read_bytes()
    header, offset = _header(path, data)
    specs = header["specs"]
    arrays = []
    digest = hashlib.blake2b(digest_size=32)
    for dtype, shape in specs:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offset + n > len(data):
            raise CorruptSnapshot(f"{path}: truncated")
        chunk = data[offset:offset + n]
        digest.update(chunk)
        arrays.append(np.frombuffer(chunk, dtype=dtype).reshape(shape))
        offset += n
    if offset != len(data):
        raise CorruptSnapshot(f"{path}: {len(data) - offset} trailing bytes")
    if digest.hexdigest() != header["checksum"]:
        raise CorruptSnapshot(f"{path}: checksum mismatch")
    return header, arrays


def drop_if_corrupt(read, path: Path):
    """read(path), but a corrupt file is logged and removed; returns None then."""
    try:
        return read(path)
    except (CorruptSnapshot, OSError) as exc:
        log.error("dropping snapshot file: %s", exc)
        path.unlink(missing_ok=True)
        return None
