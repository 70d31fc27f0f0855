"""The wire codec shared by every message: msgpack header plus zero-copy array frames.

Frame layout of one message (a ZeroMQ multipart):

    frame 0      msgpack map {"v": VERSION, "k": kind, "f": {field: value},
                              "a": {field: [[dtype, shape, frame_index], ...]}}
    frame 1..n   raw C-contiguous array bytes, one frame per array, in the order of "a"

`kind` is a single-byte code, unique across all messages. Array fields hold an ndarray, a list of
ndarrays, or None. Nothing is pickled: only msgpack primitives and raw bytes travel. Integers (fields
and list items) fit int64, floats (fields and list items) are finite, a dict field holds scalars under
string keys. A field typed with a dataclass (`sampling: SamplingParams`) is a map of all its fields,
each of its declared type, rebuilt into the dataclass, whose own checks then apply; one typed with a
list of a dataclass (`seqs: list[Tokens]`) is a list of such maps. A header of another
version, an unknown kind, a missing or extra field (of a message or such a map), a field of the wrong
type or that its dataclass refuses, an unreferenced frame or a frame whose size disagrees with its dtype
and shape raises ProtocolError, which carries the request id when the header was readable; so does any
other undecodable input, and a message over its receiver's WireLimits. VERSION changes with the layout
and with any message's fields (held exactly): 2 whole SamplingParams; 3 `kv_type` (common.kv_cache) with
every state, Hello and Heartbeat; 4 `grammar`; 5 log-probabilities, penalties and `logit_bias`; 6 `rope_delta`
(common.state) and PrefillRequest's `images`; 7 placement (`slots`, `hold_budget`, `held`, `hold`, `hold_at`,
HoldState, NotHeld); 8 Heartbeat's `steps` and `busy`; 9 Snapshot's `since`, `recurrent`, `k` and `v` (the
KV rows past the previous Snapshot only); 10 DecodeStep, one message a step for every sequence's tokens, where
Tokens went once a sequence a step; 11 Finished's `since`, `recurrent`, `k` and `v` (the KV rows past the
prompt's snapshot only) and DecodeRequest's `since`. Peers of two versions refuse each other's every message.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, get_type_hints

import msgpack
import numpy as np

from .fields import INT64, Field, as_maps, built, problem, typed

VERSION = 11

# dtypes allowed on the wire; anything else is refused on both ends
WIRE_DTYPES = {"float32", "float16", "int32", "int64", "uint8", "int8"}
MAX_NDIM = 8


class ProtocolError(ValueError):
    """A frame that cannot be decoded; `rid` is the request id when it could be read, and
    `reason` is "decode" or "too_large" (the label of fermium_protocol_errors_total)."""

    def __init__(self, message: str, rid: str = "", reason: str = "decode"):
        super().__init__(message)
        self.rid, self.reason = rid, reason
        self.rids = (rid,) if rid else ()      # every request the message named (a DecodeStep's sequences)


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


_REGISTRY: dict[int, type[Message]] = {}
_SCALAR_TYPES: dict[type[Message], dict[str, Field]] = {}
_ARRAY_LISTS: dict[type[Message], dict[str, bool]] = {}   # field -> travels as a list of arrays


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
        _SCALAR_TYPES[cls] = {f.name: typed(str(f.type), hints[f.name]) for f in fields if f.name not in cls.ARRAYS}
        _ARRAY_LISTS[cls] = {f.name: str(f.type).startswith("list") for f in fields if f.name in cls.ARRAYS}
        return cls

    return wrap


def kinds() -> dict[int, type[Message]]:
    return dict(_REGISTRY)


# ---- encode -------------------------------------------------------------------------------
def encode(msg: Message) -> list[Any]:
    """Message -> multipart frames: [header, *array buffers] (arrays are not copied)."""
    fields, arrays, frames = {}, {}, []
    types = _SCALAR_TYPES.get(type(msg), {})
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if f.name not in msg.ARRAYS:
            field = types.get(f.name)
            if field and field.struct and not field.holds(value):
                raise ProtocolError(f"{type(msg).__name__}.{f.name}: {type(value).__name__} is not allowed", msg.rid)
            value = as_maps(value, field)
            if field and (why := problem(value, field)):
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
    except ProtocolError as e:
        if e.reason != "too_large":      # not read again
            e.rids = _named(frames) or e.rids
        raise
    except Exception as e:   # a gap in the checks above must still not escape as anything else
        raise ProtocolError(f"undecodable message: {type(e).__name__}: {e}") from None


def _named(frames: list[Any]) -> tuple[str, ...]:
    """Every request id that a refused message's readable header names: its rid, and those of the maps
    in its list fields (a DecodeStep's sequences), for the receiver to end them all."""
    try:
        fields = msgpack.unpackb(bytes(_buffer(frames[0])), raw=False).get("f")
        named = [fields.get("rid")] + [v.get("rid") for value in fields.values() if isinstance(value, list)
                                       for v in value if isinstance(v, dict)]
    except Exception:                  # nothing readable names them
        return ()
    return tuple(dict.fromkeys(r for r in named if isinstance(r, str) and r))


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
        if why := problem(value, field):
            raise ProtocolError(f"{cls.__name__}.{name}: {why}", rid)
        if field.struct:
            try:
                values[name] = built(field, value)
            except (TypeError, ValueError, OverflowError) as e:
                raise ProtocolError(f"{cls.__name__}.{name}: {e}", rid) from None
    used: set[int] = set()
    for name, as_list in _ARRAY_LISTS[cls].items():
        values[name] = _arrays(arrays[name], as_list, frames, used, f"{cls.__name__}.{name}", rid)
    if len(used) != len(frames) - 1:
        raise ProtocolError(f"{cls.__name__}: {len(frames) - 1 - len(used)} frames not referenced by the header", rid)
    return cls(**values)
