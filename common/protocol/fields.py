"""What a message's header field may hold, and the checks that hold it there (codec.py): scalars of
their declared type, integers that fit int64, finite floats, lists of int or float, a dict of scalars
under string keys, a dataclass as the map of its fields, and a list of such maps.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

INT64 = (-2 ** 63, 2 ** 63 - 1)


@dataclasses.dataclass(frozen=True)
class Field:
    types: tuple[type, ...]      # what the value may be
    items: type | None           # list[int], list[float]: the type of every item
    struct: type | None = None   # a dataclass that travels as a map of its fields
    members: dict | None = None  # struct: field name -> Field
    many: bool = False           # a list of struct maps

    def holds(self, value: Any) -> bool:
        """Whether a struct field's value, as code gives it, is its dataclass (a list of them, with `many`)."""
        items = (value if isinstance(value, list) else None) if self.many else [value]
        return items is not None and all(isinstance(v, self.struct) for v in items)


_PY_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
             "dict": (dict,), "list": (list,), "None": (type(None),)}


def _accepted(annotation: str) -> Field:
    """What a field annotation accepts, e.g. 'list[int] | None' -> (list, NoneType), items int."""
    out, items = (), None
    for part in annotation.split("|"):
        part = part.strip()
        out += _PY_TYPES.get(part.split("[")[0], (object,))
        items = {"list[int]": int, "list[float]": float}.get(part, items)
    return Field(out, items)


def typed(annotation: str, hint: Any) -> Field:
    """A field's Field; a dataclass `hint` travels as a map of its fields, a list of one as a list of maps."""
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
    struct = hint if dataclasses.is_dataclass(hint) else item if dataclasses.is_dataclass(item) else None
    if struct is None:
        return _accepted(annotation)
    members = {f.name: _accepted(str(f.type)) for f in dataclasses.fields(struct)}
    return Field((list,) if struct is item else (struct,), None, struct, members, many=struct is item)


def _struct_problem(value: Any, field: Field) -> str | None:
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


def problem(value: Any, field: Field) -> str | None:
    """Why a header value is not allowed for `field` (a scalar, a struct's map or a list of them), or None."""
    if not field.many:
        return (_struct_problem if field.struct else _scalar_problem)(value, field)
    if not isinstance(value, list):
        return f"{type(value).__name__} is not a list of {field.struct.__name__} maps"
    return next((f"[{i}] {why}" for i, item in enumerate(value) if (why := _struct_problem(item, field))), None)


def as_maps(value: Any, field: Field | None) -> Any:
    """A struct field's dataclass (or list of them: Field.holds) as the maps that travel; anything else as it is."""
    if field is None or field.struct is None:
        return value
    def as_map(v: Any) -> dict:
        return {name: getattr(v, name) for name in field.members}
    return [as_map(v) for v in value] if field.many else as_map(value)


def built(field: Field, value: Any) -> Any:
    """A struct field's maps, checked, as its dataclass (or a list of them); raises what the dataclass raises."""
    if not field.many:
        return field.struct(**value)
    out = []
    for i, item in enumerate(value):
        try:
            out.append(field.struct(**item))
        except (TypeError, ValueError, OverflowError) as e:
            raise type(e)(f"[{i}] {e}") from None
    return out


def _scalar_problem(value: Any, field: Field) -> str | None:
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
