"""Tool-call argument values: raw parameter text converted by the tool's JSON-schema type.

Qwen3.6 writes every value as text between `<parameter=KEY>` and `</parameter>`; only the
request's schema (`tools[].function.parameters.properties[KEY].type`) says what it was meant to be.

- string: the text verbatim (the parser has already dropped one newline at each end).
- integer, number, boolean, null: the JSON literal (`5.0` for an integer is 5).
- object, array: JSON; failing that a Python literal (`{'a': True}`), as vLLM's qwen3_coder falls
  back to `ast.literal_eval`.
- a list of types (`["integer", "null"]`, or `anyOf` branches): null first, then each non-string
  type in order, then string.
- an unknown parameter or a schema without a type: JSON if the text parses, else the string.

A value that fits none of its declared types is kept as the string and reported as a failure.
"""
from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

LITERAL_LIMIT = 100_000  # characters; ast.literal_eval on larger text costs more than it saves


class ToolSchemas:
    """The request's tools, by function name: which names exist, and each one's parameter schemas."""

    def __init__(self, tools: Iterable[Any] | None):
        self._properties: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            self._properties[function["name"]] = properties if isinstance(properties, Mapping) else {}

    def __bool__(self) -> bool:
        return bool(self._properties)

    def __contains__(self, name: object) -> bool:
        return name in self._properties

    def convert(self, function: str, key: str, raw: str) -> tuple[Any, bool]:
        """(value, ok) for parameter `key` of `function`; ok is False when the text fit no declared type."""
        return convert_value(raw, self._properties.get(function, {}).get(key))


class Arguments:
    """The arguments JSON of one call, written as its parameters complete: `{"k": v`, `, "k2": v2`, `}`.
    The fragments join to json.dumps of the arguments dict; a repeated key keeps its first value."""

    def __init__(self, schemas: ToolSchemas, function: str):
        self._schemas, self._function = schemas, function
        self._keys: set[str] = set()

    def add(self, key: str, raw: str) -> tuple[str, bool]:
        """(fragment, ok) for the text between a parameter's tags; ("", False) for a repeated key."""
        if key in self._keys:
            return "", False
        raw = raw[1:] if raw.startswith("\n") else raw
        value, ok = self._schemas.convert(self._function, key, raw[:-1] if raw.endswith("\n") else raw)
        fragment = ("{" if not self._keys else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        self._keys.add(key)
        return fragment + json.dumps(value, ensure_ascii=False), ok

    def close(self) -> str:
        return "}" if self._keys else "{}"


def declared_types(schema: Any) -> list[str]:
    """The JSON-schema type names a property allows, in order; [] when it does not say."""
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind.lower()]
    if isinstance(kind, list):
        return [k.lower() for k in kind if isinstance(k, str)]
    out: list[str] = []
    for branch in list(schema.get("anyOf") or ()) + list(schema.get("oneOf") or ()):
        out += [k for k in declared_types(branch) if k not in out]
    return out


def convert_value(raw: str, schema: Any) -> tuple[Any, bool]:
    types = declared_types(schema)
    if not types or not any(t in _STRICT or t in ("string", "null") for t in types):
        return json_or_string(raw), True
    text = raw.strip()
    if "null" in types and text == "null":
        return None, True
    for kind in types:
        if kind in _STRICT:
            ok, value = _STRICT[kind](text)
            if ok:
                return value, True
    if "string" in types:
        return raw, True
    return raw, False


def json_or_string(raw: str) -> Any:
    ok, value = _json(raw.strip())
    return value if ok else raw


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, parse_constant=_reject_constant)
    except Exception:  # malformed model output of any kind, deep nesting included
        return False, None


def _literal(text: str) -> tuple[bool, Any]:
    if len(text) > LITERAL_LIMIT:
        return False, None
    try:
        return True, _plain(ast.literal_eval(text))
    except Exception:  # literal_eval raises many kinds on odd text
        return False, None


def _plain(value: Any) -> Any:
    """A Python literal as the JSON value it spells; ValueError for what JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _integer(text: str) -> tuple[bool, Any]:
    ok, value = _json(text)
    if ok and isinstance(value, float) and value.is_integer():
        value = int(value)
    return (ok and isinstance(value, int) and not isinstance(value, bool)), value


def _number(text: str) -> tuple[bool, Any]:
    ok, value = _json(text)
    return (ok and isinstance(value, (int, float)) and not isinstance(value, bool)), value


def _boolean(text: str) -> tuple[bool, Any]:
    lowered = text.lower()
    return lowered in ("true", "false"), lowered == "true"


def _container(kind: type) -> Any:
    def parse(text: str) -> tuple[bool, Any]:
        ok, value = _json(text)
        if not ok:
            ok, value = _literal(text)
        return (ok and isinstance(value, kind)), value
    return parse


_STRICT = {"integer": _integer, "number": _number, "boolean": _boolean,
           "object": _container(dict), "array": _container(list)}
