"""The wire codec shared by every message: msgpack header plus zero-copy array frames.

Frame layout of one message (a ZeroMQ multipart):

    frame 0      msgpack map {"v": VERSION, "k": kind, "f": {field: value},
                              "a": {field: [[dtype, shape, frame_index], ...]}}
    frame 1..n   raw C-contiguous array bytes, one frame per array, in the order of "a"

`kind` is a single-byte code, unique across all messages. Array fields hold an ndarray, a list of
ndarrays, or None. Nothing is pickled: only msgpack primitives and raw bytes travel. Integers (fields
and list items) fit int64, floats (fields and list items) are finite, a dict field holds scalars under
string keys. A field typed with a dataclass (`sampling: SamplingParams`) is a map of all its fields,
each of its declared type, rebuilt into the dataclass, whose own checks then apply. A header of another
version, an unknown kind, a missing or extra field (of a message or such a map), a field of the wrong
type or that its dataclass refuses, an unreferenced frame or a frame whose size disagrees with its dtype
and shape raises ProtocolError, which carries the request id when the header was readable; so does any
other undecodable input, and a message over its receiver's WireLimits. VERSION changes with the layout
and with any message's fields (held exactly): 2 whole SamplingParams; 3 `kv_type` (common.kv_cache) with
every state, Hello and Heartbeat; 4 `grammar`; 5 log-probabilities, penalties and `logit_bias`; 6 `rope_delta`
(common.state) and PrefillRequest's `images`; 7 placement (`slots`, `hold_budget`, `held`, `hold`, `hold_at`,
HoldState, NotHeld); 8 Heartbeat's `steps` and `busy`; 9 Snapshot's `since`, `recurrent`, `k` and `v` (the
KV rows past the previous Snapshot only). Peers of two versions refuse each other's every message.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, get_type_hints

import msgpack
import numpy as np

VERSION = 9

# dtypes allowed on the wire; anything else is refused on both ends
WIRE_DTYPES = {"float32", "float16", "int32", "int64", "uint8", "int8"}
INT64 = (-2 ** 63, 2 ** 63 - 1)
MAX_NDIM = 8


class ProtocolError(ValueError):
    """A frame that cannot be decoded; `rid` is the request id when it could be read, and
    `reason` is "decode" or "too_large" (the label of fermium_protocol_errors_total)."""

    def __init__(self, message: str, rid: str = "", reason: str = "decode"):
        super().__init__(message)
        self.rid, self.reason = rid, reason


@dataclasses.dataclass(frozen=True)
class WireLimits:
    """The largest legitimate message a receiver accepts (common.state.wire_limits builds it)."""

    frame_bytes: int             # any one frame (ZeroMQ's MAXMSGSIZE, which is per frame)
    message_bytes: int           # all frames together
    frames: int


@dataclasses.dataclass(frozen=True)
class Message:
    """Base of every wire message: `rid` (request id) comes first in all of them."""

    rid: str
    KIND: ClassVar[int] = -1
    ARRAYS: ClassVar[tuple[str, ...]] = ()


@dataclasses.dataclass(frozen=True)
class _Field:
    types: tuple[type, ...]      # what the value may be
    items: type | None           # list[int], list[float]: the type of every item
    struct: type | None = None   # a dataclass that travels as a map of its fields
    members: dict | None = None  # struct: field name -> _Field


_REGISTRY: dict[int, type[Message]] = {}
_SCALAR_TYPES: dict[type[Message], dict[str, _Field]] = {}
_ARRAY_LISTS: dict[type[Message], dict[str, bool]] = {}   # field -> travels as a list of arrays

_PY_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
             "dict": (dict,), "list": (list,), "None": (type(None),)}


def _accepted(annotation: str) -> _Field:
    """What a field annotation accepts, e.g. 'list[int] | None' -> (list, NoneType), items int."""
    out, items = (), None
    for part in annotation.split("|"):
        part = part.strip()
        out += _PY_TYPES.get(part.split("[")[0], (object,))
        items = {"list[int]": int, "list[float]": float}.get(part, items)
    return _Field(out, items)


def _typed(annotation: str, hint: Any) -> _Field:
    """A field's _Field; a dataclass `hint` travels as a map of its fields."""
    if not dataclasses.is_dataclass(hint):
        return _accepted(annotation)
    return _Field((hint,), None, hint, {f.name: _accepted(str(f.type)) for f in dataclasses.fields(hint)})


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
        fields, hints = dataclasses.fields(cls), get_type_hints(cls)
        _SCALAR_TYPES[cls] = {f.name: _typed(str(f.type), hints[f.name]) for f in fields if f.name not in cls.ARRAYS}
        _ARRAY_LISTS[cls] = {f.name: str(f.type).startswith("list") for f in fields if f.name in cls.ARRAYS}
        return cls

    return wrap


def kinds() -> dict[int, type[Message]]:
    return dict(_REGISTRY)


def _struct_problem(value: Any, field: _Field) -> str | None:
    """Why a map cannot be the fields of `field.struct`, or None."""
    if not isinstance(value, dict):
        return f"{type(value).__name__} is not a map of {field.struct.__name__} fields"
    if set(value) != set(field.members):
        extra = sorted(str(k)[:40] for k in set(value) - set(field.members))
        return f"missing fields {sorted(set(field.members) - set(value))}, unknown fields {extra}"
    for name, member in field.members.items():
        if why := _scalar_problem(value[name], member):
            return f"{name}: {why}"
    return None


def _scalar_problem(value: Any, field: _Field) -> str | None:
    """Why a header value is not allowed for `field`, or None."""
    if isinstance(value, bool) and bool not in field.types:
        return "bool is not allowed"
    if not isinstance(value, field.types):
        return f"{type(value).__name__} is not allowed"
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return "integer does not fit int64"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not finite"
    if isinstance(value, list) and field.items is not None:         # list[float] takes int64 integers too
        if not all(type(v) is int and INT64[0] <= v <= INT64[1] or field.items is float and type(v) is float
                   and math.isfinite(v) for v in value):
            return "items must be int64 integers" if field.items is int else "items must be finite numbers"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return "keys must be strings"
            if not (v is None or isinstance(v, (str, bool, int, float))):
                return f"{k!r}: {type(v).__name__} is not a scalar"
            if isinstance(v, int) and not INT64[0] <= v <= INT64[1]:
                return f"{k!r}: integer does not fit int64"
            if isinstance(v, float) and not math.isfinite(v):
                return f"{k!r}: {v} is not finite"
    return None


# ---- encode -------------------------------------------------------------------------------
def encode(msg: Message) -> list[Any]:
    """Message -> multipart frames: [header, *array buffers] (arrays are not copied)."""
    fields, arrays, frames = {}, {}, []
    types = _SCALAR_TYPES.get(type(msg), {})
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if f.name not in msg.ARRAYS:
            field = types.get(f.name)
            struct = field is not None and field.struct is not None and isinstance(value, field.struct)
            value = {name: getattr(value, name) for name in field.members} if struct else value
            if field and (why := (_struct_problem if struct else _scalar_problem)(value, field)):
                raise ProtocolError(f"{type(msg).__name__}.{f.name}: {why}", msg.rid)
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
    try:
        header = msgpack.packb({"v": VERSION, "k": msg.KIND, "f": fields, "a": arrays}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"{type(msg).__name__} cannot be encoded: {e}", msg.rid) from None
    return [header, *frames]


# ---- decode -------------------------------------------------------------------------------
def _buffer(frame: Any) -> memoryview:
    try:
        return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    except TypeError:
        raise ProtocolError(f"a frame must be bytes-like, got {type(frame).__name__}") from None


def _array(desc: Any, frames: list[Any], used: set[int], where: str, rid: str) -> np.ndarray:
    if not (isinstance(desc, list) and len(desc) == 3):
        raise ProtocolError(f"{where}: array descriptor must be [dtype, shape, frame], got {desc!r:.80}", rid)
    dtype, shape, index = desc
    if not (isinstance(dtype, str) and dtype in WIRE_DTYPES):
        raise ProtocolError(f"{where}: dtype {dtype!r:.40} is not one of {sorted(WIRE_DTYPES)}", rid)
    if not (isinstance(shape, list) and len(shape) <= MAX_NDIM
            and all(type(s) is int and 0 <= s <= INT64[1] for s in shape)):
        raise ProtocolError(f"{where}: bad shape {shape!r:.80}", rid)
    if not (type(index) is int and 1 <= index < len(frames)) or index in used:
        raise ProtocolError(f"{where}: frame index {index!r:.40} is missing or reused ({len(frames)} frames)", rid)
    used.add(index)
    buf = _buffer(frames[index])
    want = math.prod(shape) * np.dtype(dtype).itemsize      # exact: a Python int never overflows
    if buf.nbytes != want:
        raise ProtocolError(f"{where}: frame {index} has {buf.nbytes} bytes, {dtype}{shape} needs {want}", rid)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _arrays(desc: Any, as_list: bool, frames: list[Any], used: set[int], where: str, rid: str) -> Any:
    if desc is None:
        return None
    if not as_list:
        return _array(desc, frames, used, where, rid)
    if not isinstance(desc, list):
        raise ProtocolError(f"{where}: a list of array descriptors is needed, got {type(desc).__name__}", rid)
    return [_array(d, frames, used, where, rid) for d in desc]


def _check_limits(frames: list[Any], limits: WireLimits | None) -> None:
    if limits is None:
        return
    if len(frames) > limits.frames:
        raise ProtocolError(f"{len(frames)} frames, at most {limits.frames} are accepted", reason="too_large")
    total = sum(_buffer(f).nbytes for f in frames)
    if total > limits.message_bytes:
        raise ProtocolError(f"{total} bytes, at most {limits.message_bytes} are accepted", reason="too_large")


def decode(frames: list[Any], limits: WireLimits | None = None) -> Message:
    """Multipart frames -> Message. Arrays are views of the received frames (read-only).
    Anything that does not decode, whatever is wrong with it, raises ProtocolError."""
    try:
        return _decode(frames, limits)
    except ProtocolError:
        raise
    except Exception as e:   # a gap in the checks above must still not escape as anything else
        raise ProtocolError(f"undecodable message: {type(e).__name__}: {e}") from None


def _decode(frames: list[Any], limits: WireLimits | None) -> Message:
    if not isinstance(frames, (list, tuple)) or not frames:
        raise ProtocolError("empty message")
    _check_limits(frames, limits)
    try:
        header = msgpack.unpackb(bytes(_buffer(frames[0])), raw=False)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not msgpack: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    fields, arrays = header.get("f"), header.get("a")
    rid = fields.get("rid", "") if isinstance(fields, dict) and isinstance(fields.get("rid"), str) else ""
    if header.get("v") != VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r:.40}, this build speaks {VERSION}: "
                            f"run the same Fermium release on every host", rid)
    kind = header.get("k")
    cls = _REGISTRY.get(kind) if type(kind) is int else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r:.40}", rid)
    if not isinstance(fields, dict) or not isinstance(arrays, dict):
        raise ProtocolError(f"{cls.__name__}: header needs maps 'f' and 'a'", rid)
    types = _SCALAR_TYPES[cls]
    if set(fields) != set(types) or set(arrays) != set(cls.ARRAYS):
        missing = (set(types) - set(fields)) | (set(cls.ARRAYS) - set(arrays))
        extra = {str(k)[:40] for k in (set(fields) - set(types)) | (set(arrays) - set(cls.ARRAYS))}
        raise ProtocolError(f"{cls.__name__}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}", rid)
    values = dict(fields)
    for name, value in fields.items():
        field = types[name]
        if why := (_struct_problem if field.struct else _scalar_problem)(value, field):
            raise ProtocolError(f"{cls.__name__}.{name}: {why}", rid)
        if field.struct:
            try:
                values[name] = field.struct(**value)
            except (TypeError, ValueError, OverflowError) as e:
                raise ProtocolError(f"{cls.__name__}.{name}: {e}", rid) from None
    used: set[int] = set()
    for name, as_list in _ARRAY_LISTS[cls].items():
        values[name] = _arrays(arrays[name], as_list, frames, used, f"{cls.__name__}.{name}", rid)
    if len(used) != len(frames) - 1:
        raise ProtocolError(f"{cls.__name__}: {len(frames) - 1 - len(used)} frames not referenced by the header", rid)
    return cls(**values)
