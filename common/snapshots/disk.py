"""The disk tier: one self-contained file per snapshot, checksummed and written atomically.

File layout (little-endian):
    magic  b"FRMSNAP\\0"   8 bytes
    version              u32 (FORMAT_VERSION)
    header_len           u32
    header_sum           32 bytes: blake2b-256 of the 16 bytes above and of the header
    header               msgpack: {"pos", "key" (hex, also the file's name), "meta" (the index
                         entry: "base" key and "blocks" chain, hex, and "rope_delta", the state's
                         (common.state; a file without it is text alone, 0)), "arrays": [[dtype, shape], ...],
                         "checksum": blake2b-256 of the payload}
    payload              the arrays' bytes back to back, in header order

Every byte that is read is under a checksum: the prefix and header under header_sum (checked
when the directory is indexed), the payload under the header's checksum (checked when the
snapshot is loaded). A file whose magic, version, lengths, checksums, field types or size do
not match raises CorruptSnapshot; the store then logs it, removes it and counts a miss.

A writer holds an flock on its temporary file until it is renamed into place, so a temporary
file that no process holds is an orphan of a writer that died (clean_orphans).
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import struct
from pathlib import Path, PurePath

import msgpack
import numpy as np

log = logging.getLogger("fermium.snapshots")
MAGIC = b"FRMSNAP\0"
FORMAT_VERSION = 2
PREFIX = struct.Struct("<8sII32s")       # magic, version, header_len, header_sum
MAX_HEADER = 1 << 24
MAX_DIMS = 8
DTYPE_KINDS = "fiu"
HEADER_KEYS = {"pos", "key", "meta", "arrays", "checksum"}
TMP_GLOB = "*.tmp*"


class CorruptSnapshot(ValueError):
    pass


def _digest(*parts) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(p)
    return h.digest()


def pack(pos: int, key: bytes, arrays: list[np.ndarray], meta: dict) -> tuple[bytes, list[memoryview]]:
    """The layout above: (prefix and header, the payload's pieces), for a file or another store."""
    views = [memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in arrays]   # empty ones too
    header = msgpack.packb({"pos": pos, "key": key.hex(), "meta": meta, "checksum": _digest(*views).hex(),
                            "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]})
    head = MAGIC + struct.pack("<II", FORMAT_VERSION, len(header))
    return head + _digest(head, header) + header, views


def write_atomic(path: Path, pos: int, key: bytes, arrays: list[np.ndarray], meta: dict) -> int:
    """Write, fsync, rename, fsync the directory. Returns the file size."""
    head, views = pack(pos, key, arrays, meta)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with open(fd, "wb") as f:
            fcntl.flock(fd, fcntl.LOCK_EX)    # held until closed: the file is not an orphan
            f.write(head)
            for view in views:
                f.write(view)
            f.flush()
            os.fsync(fd)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path.stat().st_size


def _is_hex(value, nbytes: int) -> bool:
    if not isinstance(value, str) or len(value) != 2 * nbytes:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def _specs(path: Path, arrays) -> list[tuple[np.dtype, tuple[int, ...]]]:
    if not isinstance(arrays, list):
        raise CorruptSnapshot(f"{path}: arrays is not a list")
    specs = []
    for spec in arrays:
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], list)):
            raise CorruptSnapshot(f"{path}: bad array spec {spec!r:.80}")
        dtype_str, shape = spec
        try:
            dtype = np.dtype(dtype_str)
        except Exception as exc:              # numpy raises several kinds for a bad spelling
            raise CorruptSnapshot(f"{path}: bad dtype {dtype_str!r:.40}") from exc
        if dtype.str != dtype_str or dtype.kind not in DTYPE_KINDS or dtype.byteorder == ">":
            raise CorruptSnapshot(f"{path}: dtype {dtype_str!r:.40} is not a plain little-endian number")
        if len(shape) > MAX_DIMS or not all(type(n) is int and n >= 0 for n in shape):
            raise CorruptSnapshot(f"{path}: bad shape {shape!r:.80}")
        specs.append((dtype, tuple(shape)))
    return specs


def _validate(path: Path, header) -> dict:
    """The header's fields have the types and forms that the store reads, or CorruptSnapshot."""
    if not isinstance(header, dict) or set(header) != HEADER_KEYS:
        raise CorruptSnapshot(f"{path}: header fields {list(header) if isinstance(header, dict) else header!r:.80}")
    pos, key, meta = header["pos"], header["key"], header["meta"]
    if type(pos) is not int or pos < 0:
        raise CorruptSnapshot(f"{path}: bad pos {pos!r:.40}")
    if not _is_hex(key, 16) or key != path.stem:
        raise CorruptSnapshot(f"{path}: key {key!r:.40} is not the file's name")
    if not (isinstance(meta, dict) and set(meta) - {"rope_delta"} == {"base", "blocks"} and _is_hex(meta["base"], 16)
            and isinstance(meta["blocks"], list) and all(_is_hex(b, 16) for b in meta["blocks"])):
        raise CorruptSnapshot(f"{path}: bad meta")
    delta = meta.get("rope_delta", 0)
    if type(delta) is not int or not 0 <= pos + delta <= pos:
        raise CorruptSnapshot(f"{path}: bad rope_delta {delta!r:.40}")
    if not _is_hex(header["checksum"], 32):
        raise CorruptSnapshot(f"{path}: bad checksum field")
    header["specs"] = _specs(path, header["arrays"])
    header["payload_len"] = sum(int(np.prod(s, dtype=object)) * d.itemsize for d, s in header["specs"])
    return header


def _header(path: Path, head: bytes, read_rest) -> tuple[dict, int]:
    """(validated header, payload offset); read_rest(n) returns the n bytes after the prefix."""
    if len(head) < PREFIX.size or head[:8] != MAGIC:
        raise CorruptSnapshot(f"{path}: bad magic or truncated")
    _, version, header_len, header_sum = PREFIX.unpack_from(head)
    if version != FORMAT_VERSION:
        raise CorruptSnapshot(f"{path}: format version {version}, expected {FORMAT_VERSION}")
    if header_len > MAX_HEADER:
        raise CorruptSnapshot(f"{path}: header length {header_len}")
    raw = read_rest(header_len)
    if len(raw) != header_len:
        raise CorruptSnapshot(f"{path}: truncated header")
    if _digest(head[:16], raw) != header_sum:
        raise CorruptSnapshot(f"{path}: header checksum mismatch")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise CorruptSnapshot(f"{path}: unreadable header ({exc!r:.80})") from exc
    return _validate(path, header), PREFIX.size + header_len


def read_header(path: Path) -> dict:
    """The header alone (for indexing at start-up), checked, with the file's size; the payload
    is checked when it is read."""
    with open(path, "rb") as f:
        header, offset = _header(path, f.read(PREFIX.size), f.read)
        size = os.fstat(f.fileno()).st_size
    if size != offset + header["payload_len"]:
        raise CorruptSnapshot(f"{path}: {size} bytes, its header says {offset + header['payload_len']}")
    return header


def read_checked(path: Path) -> tuple[dict, list[np.ndarray]]:
    """(header, arrays), or CorruptSnapshot with the reason."""
    return parse(path, path.read_bytes())


def parse(path: PurePath, data: bytes) -> tuple[dict, list[np.ndarray]]:
    """(header, arrays) of the bytes of a snapshot named `path` (its stem is the key), or
    CorruptSnapshot with the reason."""
    header, offset = _header(path, data[:PREFIX.size], lambda n: data[PREFIX.size:PREFIX.size + n])
    if len(data) != offset + header["payload_len"]:
        raise CorruptSnapshot(f"{path}: {len(data)} bytes, its header says {offset + header['payload_len']}")
    if _digest(memoryview(data)[offset:]).hex() != header["checksum"]:
        raise CorruptSnapshot(f"{path}: payload checksum mismatch")
    arrays = []
    for dtype, shape in header["specs"]:
        n = int(np.prod(shape, dtype=object)) * dtype.itemsize
        arrays.append(np.frombuffer(data, dtype=dtype, count=n // dtype.itemsize, offset=offset).reshape(shape))
        offset += n
    return header, arrays


def drop_if_corrupt(read, path: Path):
    """read(path), but a corrupt file is logged and removed; returns None then."""
    try:
        return read(path)
    except (CorruptSnapshot, OSError) as exc:
        log.error("dropping snapshot file: %s", exc)
        remove(path)
        return None


def remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove snapshot file %s: %s", path, exc)


def clean_orphans(directory: Path) -> int:
    """Remove the temporary files that no live writer holds (see write_atomic); returns how many.
    Another store's writes to the same directory go on untouched."""
    removed = 0
    for tmp in directory.glob(TMP_GLOB):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue                          # renamed or removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(tmp).st_ino:
                tmp.unlink()
                removed += 1
        except OSError:
            pass                              # a live writer holds it, or it moved on
        finally:
            os.close(fd)
    if removed:
        log.warning("removed %d orphaned temporary snapshot files from %s", removed, directory)
    return removed
