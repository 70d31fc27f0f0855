"""Ways to damage a snapshot file of the disk tier (common/snapshots/disk.py), one per field.

A damage named "...-signed" also recomputes the header checksum, as a writer with a bug (or
with another model) would: the file then checks out, and must be refused for what it says.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable

import msgpack

from common.snapshots import disk


def parts(path: Path) -> tuple[dict, bytes]:
    """(header, payload) of a sound file."""
    data = path.read_bytes()
    _, _, n, _ = disk.PREFIX.unpack_from(data)
    return msgpack.unpackb(data[disk.PREFIX.size:disk.PREFIX.size + n]), data[disk.PREFIX.size + n:]


def rewrite(path: Path, header, payload: bytes, *, signed: bool, version: int = disk.FORMAT_VERSION,
            raw: bytes | None = None) -> None:
    """The file with this header and payload; unsigned: the old header checksum is kept."""
    raw = msgpack.packb(header) if raw is None else raw
    head = disk.MAGIC + struct.pack("<II", version, len(raw))
    old = path.read_bytes()[16:disk.PREFIX.size]
    path.write_bytes(head + (disk._digest(head, raw) if signed else old) + raw + payload)


def edit(change: Callable[[dict], None], signed: bool) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        header, payload = parts(path)
        change(header)
        rewrite(path, header, payload, signed=signed)
    return damage


def edit_bytes(change: Callable[[bytearray], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        change(data)
        path.write_bytes(bytes(data))
    return damage


def _set(field: str, value) -> Callable[[dict], None]:
    return lambda h: h.__setitem__(field, value)


def _flip_hex(s: str) -> str:
    return ("1" if s[0] == "0" else "0") + s[1:]


def _fold(h: dict) -> None:
    shape = h["arrays"][0][1]
    h["arrays"][0][1] = shape[::-1]        # (channels, kernel-1) read as (kernel-1, channels)


def _set_dtype(dtype: str, index: int = 0) -> Callable[[dict], None]:
    return lambda h: h["arrays"][index].__setitem__(0, dtype)


def _header_len(delta: int) -> Callable[[bytearray], None]:
    def change(d: bytearray) -> None:
        n = struct.unpack_from("<I", d, 12)[0]
        struct.pack_into("<I", d, 12, (n + delta) % 2**32)
    return change


def _version(v: int) -> Callable[[Path], None]:
    return lambda p: rewrite(p, *parts(p), signed=True, version=v)


def _byte(offset: int) -> Callable[[bytearray], None]:
    return lambda d: d.__setitem__(offset, d[offset] ^ 0x55)


# Refused when the directory is indexed: everything but the payload is read then.
HEADER_DAMAGES: dict[str, Callable[[Path], None]] = {
    "magic": edit_bytes(lambda d: d.__setitem__(slice(0, 8), b"FRMSNAPX")),
    "version-old": _version(disk.FORMAT_VERSION - 1),
    "version-new": _version(disk.FORMAT_VERSION + 1),
    "header-len-long": edit_bytes(_header_len(1)),
    "header-len-short": edit_bytes(_header_len(-1)),
    "header-len-huge": edit_bytes(_header_len(2**31)),
    "header-sum": edit_bytes(_byte(20)),
    "header-byte": edit_bytes(_byte(disk.PREFIX.size + 3)),
    "pos": edit(lambda h: h.__setitem__("pos", h["pos"] + 1), signed=False),
    "pos-signed": edit(lambda h: h.__setitem__("pos", h["pos"] + 1), signed=True),
    "pos-str-signed": edit(lambda h: h.__setitem__("pos", str(h["pos"])), signed=True),
    "pos-negative-signed": edit(_set("pos", -1), signed=True),
    "pos-bool-signed": edit(_set("pos", True), signed=True),
    "key": edit(lambda h: h.__setitem__("key", _flip_hex(h["key"])), signed=False),
    "key-signed": edit(lambda h: h.__setitem__("key", _flip_hex(h["key"])), signed=True),
    "key-int-signed": edit(_set("key", 7), signed=True),
    "meta": edit(lambda h: h["meta"].__setitem__("base", _flip_hex(h["meta"]["base"])), signed=False),
    "meta-base-signed": edit(lambda h: h["meta"].__setitem__("base", _flip_hex(h["meta"]["base"])), signed=True),
    "meta-blocks-signed": edit(lambda h: h["meta"]["blocks"].append("00" * 16), signed=True),
    "meta-list-signed": edit(_set("meta", [1, 2]), signed=True),
    "dtype": edit(_set_dtype("<i4"), signed=False),
    "dtype-signed": edit(_set_dtype("<i4"), signed=True),
    "dtype-logits-signed": edit(_set_dtype("<i4", -1), signed=True),
    "dtype-object-signed": edit(_set_dtype("|O"), signed=True),
    "dtype-garbage-signed": edit(_set_dtype("no such type"), signed=True),
    "shape": edit(_fold, signed=False),
    "shape-folded-signed": edit(_fold, signed=True),
    "shape-negative-signed": edit(lambda h: h["arrays"][0].__setitem__(1, [-1, 3]), signed=True),
    "shape-huge-signed": edit(lambda h: h["arrays"][0].__setitem__(1, [2**62, 2**62]), signed=True),
    "arrays-missing-signed": edit(lambda h: h["arrays"].pop(), signed=True),
    "checksum-field-type-signed": edit(_set("checksum", 12), signed=True),
    "extra-field-signed": edit(_set("extra", 1), signed=True),
    "not-a-map-signed": lambda p: rewrite(p, [1, 2, 3], parts(p)[1], signed=True),
    "not-msgpack-signed": lambda p: rewrite(p, None, parts(p)[1], signed=True, raw=b"\xc1\xc1\xc1"),
    "truncated": edit_bytes(lambda d: d.__delitem__(slice(len(d) - 100, None))),
    "truncated-to-prefix": edit_bytes(lambda d: d.__delitem__(slice(disk.PREFIX.size, None))),
    "empty": edit_bytes(lambda d: d.clear()),
    "trailing-bytes": edit_bytes(lambda d: d.extend(b"\0" * 8)),
}
# Refused when the snapshot is loaded: the payload is read and checked only then.
PAYLOAD_DAMAGES: dict[str, Callable[[Path], None]] = {
    "checksum": edit(lambda h: h.__setitem__("checksum", _flip_hex(h["checksum"])), signed=True),
    "payload-first-byte": lambda p: edit_bytes(_byte(p.stat().st_size - len(parts(p)[1])))(p),
    "payload-last-byte": edit_bytes(_byte(-1)),
}
DAMAGES = {**HEADER_DAMAGES, **PAYLOAD_DAMAGES}
