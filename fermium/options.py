"""Typer options generated from config dataclasses (common/config.py says what a field carries).

`options(Config, *names, **changes)` makes one typer parameter per setting: `--kebab-name`,
env FERMIUM_UPPER_NAME (and an alias's), the field's default (in the option's unit), its help
and type. `@command(...)` lays them out among the function's own parameters; the function gets
them in `**settings`, and `config(Config, settings)` turns them back into the dataclass.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from common.config import default as field_default
from common.config import settings as fields_of

ENV_PREFIX = "FERMIUM_"


def _cli_type(hint: Any, meta: dict) -> Any:
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if meta.get("unit"):
        base = float
    elif meta.get("path"):
        base = Path
    return Optional[base] if optional or base is Path else base


def options(cls: type, *names: str, env: bool = True, **changes: dict) -> list[inspect.Parameter]:
    """Typer parameters for the settings of `cls` (those named, in that order; else all of them).
    `changes[name]` replaces some of one option's help, default or min."""
    fields, hints = fields_of(cls), typing.get_type_hints(cls)
    out = []
    for name in names or fields:
        f = fields[name]
        meta = {**f.metadata, **changes.get(name, {})}
        spelled = [name, *meta.get("aliases", ())]
        flags = [f"--{n.replace('_', '-')}" for n in spelled] if len(spelled) > 1 else []   # else typer's own
        envvar = [ENV_PREFIX + n.upper() for n in spelled] if len(spelled) > 1 else ENV_PREFIX + name.upper()
        info = typer.Option(*flags, help=meta["help"], envvar=envvar if env else None, min=meta.get("min"))
        value = meta["default"] if "default" in meta else field_default(cls, name)
        value = None if value is dataclasses.MISSING else value      # a required field: the caller fills it
        if meta.get("unit"):
            value = meta["unit"].from_base(value)
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value,
                                     annotation=Annotated[_cli_type(hints[name], meta), info]))
    return out


def command(*layout: list[inspect.Parameter] | str) -> Callable:
    """The decorated function's parameters become `layout`: generated ones, and the function's own
    named by strings; its own that are not named follow (all keyword-only, as typer passes them)."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        own = {n: p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in sig.parameters.items()
               if p.kind is not inspect.Parameter.VAR_KEYWORD}
        params = [p for part in layout for p in ([own.pop(part)] if isinstance(part, str) else part)]
        fn.__signature__ = sig.replace(parameters=params + list(own.values()))
        return fn

    return wrap


def defaults(fn: Callable) -> dict[str, Any]:
    """Every parameter's default, to call a command from another one."""
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def config(cls: type, values: dict[str, Any], **resolved: Any) -> Any:
    """The config dataclass from option values (converted back from their units) and `resolved`."""
    fields, kwargs = fields_of(cls), {}
    for name, value in values.items():
        if name not in fields:
            continue
        meta = fields[name].metadata
        if meta.get("unit"):
            value = meta["unit"].to_base(value)
        elif meta.get("path") and value is not None:
            value = str(value)
        kwargs[name] = value
    return cls(**{**kwargs, **resolved})

