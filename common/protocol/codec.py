"""The wire codec shared by every message: msgpack header plus zero-copy array frames.

Frame layout of one message (a ZeroMQ multipart):

    frame 0      msgpack map {"v": VERSION, "k": kind, "f": {field: value},
                              "a": {field: [[dtype, shape, frame_index], ...]}}
    frame 1..n   raw C-contiguous array bytes, one frame per array, in the order of "a"

`kind` is a single-byte code, unique across all messages. Array fields hold an ndarray, a list
of ndarrays, or None. Nothing is pickled: only msgpack primitives and raw bytes travel.
A header of another version, an unknown kind, a missing or extra field, a field of the wrong
type, an unreferenced frame or a frame whose size disagrees with its dtype and shape raises
ProtocolError, which carries the request id when the header was readable.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import msgpack
import numpy as np

VERSION = 1

# dtypes allowed on the wire; anything else is refused on both ends
WIRE_DTYPES = {"float32", "float16", "int32", "int64", "uint8", "int8"}


class ProtocolError(ValueError):
    """A frame that cannot be decoded; `rid` is the request id when it could be read."""

    def __init__(self, message: str, rid: str = ""):
        super().__init__(message)
        self.rid = rid


@dataclasses.dataclass(frozen=True)
class Message:
    """Base of every wire message: `rid` (request id) comes first in all of them."""

    rid: str
    KIND: ClassVar[int] = -1
    ARRAYS: ClassVar[tuple[str, ...]] = ()


_REGISTRY: dict[int, type[Message]] = {}
_SCALAR_TYPES: dict[type[Message], dict[str, tuple[type, ...]]] = {}

_PY_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
             "dict": (dict,), "list": (list,), "None": (type(None),)}


def _accepted(annotation: str) -> tuple[type, ...]:
    """Python types a field annotation accepts, e.g. 'list[int] | None' -> (list, NoneType)."""
    out: tuple[type, ...] = ()
    for part in annotation.split("|"):
        base = part.strip().split("[")[0]
        out += _PY_TYPES.get(base, (object,))
    return out


def message(kind: int):
    """Register a frozen dataclass as a wire message with a single-byte kind code."""

    def wrap(cls: type[Message]) -> type[Message]:
        if not 0 <= kind <= 255:
            raise ValueError(f"kind {kind} of {cls.__name__} is not a single byte")
        if kind in _REGISTRY:
            raise ValueError(f"kind 0x{kind:02x} used by both {_REGISTRY[kind].__name__} and {cls.__name__}")
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.KIND = kind
        _REGISTRY[kind] = cls
        _SCALAR_TYPES[cls] = {f.name: _accepted(str(f.type)) for f in dataclasses.fields(cls)
                              if f.name not in cls.ARRAYS}
        return cls

    return wrap


def kinds() -> dict[int, type[Message]]:
    return dict(_REGISTRY)


# ---- encode -------------------------------------------------------------------------------

def encode(msg: Message) -> list[Any]:
    """Message -> multipart frames: [header, *array buffers] (arrays are not copied)."""
    fields, arrays, frames = {}, {}, []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if f.name not in msg.ARRAYS:
            fields[f.name] = value
            continue
        if value is None:
            arrays[f.name] = None
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        descs = []
        for a in items:
            a = np.ascontiguousarray(a)
            if a.dtype.name not in WIRE_DTYPES:
                raise ProtocolError(f"{type(msg).__name__}.{f.name}: dtype {a.dtype} cannot go on the wire", msg.rid)
            frames.append(memoryview(a.reshape(-1)).cast("B") if a.size else b"")
            descs.append([a.dtype.name, list(a.shape), len(frames)])
        arrays[f.name] = descs if isinstance(value, (list, tuple)) else descs[0]
    header = msgpack.packb({"v": VERSION, "k": msg.KIND, "f": fields, "a": arrays}, use_bin_type=True)
    return [header, *frames]


# ---- decode -------------------------------------------------------------------------------

def _buffer(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _array(desc: Any, frames: list[Any], used: set[int], where: str, rid: str) -> np.ndarray:
    if not (isinstance(desc, list) and len(desc) == 3):
        raise ProtocolError(f"{where}: array descriptor must be [dtype, shape, frame], got {desc!r}", rid)
    dtype, shape, index = desc
    if dtype not in WIRE_DTYPES:
        raise ProtocolError(f"{where}: dtype {dtype!r} is not one of {sorted(WIRE_DTYPES)}", rid)
    if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
        raise ProtocolError(f"{where}: bad shape {shape!r}", rid)
    if not (isinstance(index, int) and 1 <= index < len(frames)) or index in used:
        raise ProtocolError(f"{where}: frame index {index!r} is missing or reused ({len(frames)} frames)", rid)
    used.add(index)
    buf = _buffer(frames[index])
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if buf.nbytes != want:
        raise ProtocolError(f"{where}: frame {index} has {buf.nbytes} bytes, {dtype}{shape} needs {want}", rid)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def decode(frames: list[Any]) -> Message:
    """Multipart frames -> Message. Arrays are views of the received frames (read-only)."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = msgpack.unpackb(bytes(_buffer(frames[0])), raw=False)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not msgpack: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    fields, arrays = header.get("f"), header.get("a")
    rid = fields.get("rid", "") if isinstance(fields, dict) and isinstance(fields.get("rid"), str) else ""
    if header.get("v") != VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r}, this build speaks {VERSION}", rid)
    cls = _REGISTRY.get(header.get("k"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message kind {header.get('k')!r}", rid)
    if not isinstance(fields, dict) or not isinstance(arrays, dict):
        raise ProtocolError(f"{cls.__name__}: header needs maps 'f' and 'a'", rid)
    types = _SCALAR_TYPES[cls]
    if set(fields) != set(types) or set(arrays) != set(cls.ARRAYS):
        missing = (set(types) - set(fields)) | (set(cls.ARRAYS) - set(arrays))
        extra = (set(fields) - set(types)) | (set(arrays) - set(cls.ARRAYS))
        raise ProtocolError(f"{cls.__name__}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}", rid)
    for name, value in fields.items():
        if not isinstance(value, types[name]) or (isinstance(value, bool) and bool not in types[name]):
            raise ProtocolError(f"{cls.__name__}.{name}: {type(value).__name__} is not allowed", rid)
    used: set[int] = set()
    values = dict(fields)
    for name, desc in arrays.items():
        where = f"{cls.__name__}.{name}"
        if desc is None:
            values[name] = None
        elif desc and isinstance(desc[0], list):
            values[name] = [_array(d, frames, used, where, rid) for d in desc]
        elif desc == []:
            values[name] = []
        else:
            values[name] = _array(desc, frames, used, where, rid)
    if len(used) != len(frames) - 1:
        raise ProtocolError(f"{cls.__name__}: {len(frames) - 1 - len(used)} frames not referenced by the header", rid)
    return cls(**values)
