"""Every runner and prefill backend by name, in one place: where its class lives, how to tell
whether this machine can run it, and how to construct it. Decode, the `cpu` prefill backend,
`fermium generate` and the benchmarks load runners here (`native`, `reference`, or `auto`:
native when it loads, else reference); the prefill worker its backend (`cpu`, `cuda`). The
classes provide common.engine_types' Protocols.

A class is named by its module and imported on first use, so that nothing loads a kernel or
pycuda until asked, and a module that fails to import is reported as unavailable. Each class has a
classmethod `availability() -> (ok, why)` and is constructed as `cls(model, **options)`, with the
options it `takes`.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

from common.engine_types import PrefillBackend, Runner
from common.errors import UserError

log = logging.getLogger("fermium.engines")

RUNNER, PREFILL = "runner", "prefill backend"       # the roles
AUTO = "auto"                                       # the runner: native when it loads, else reference


class UnknownEngineError(UserError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class EngineUnavailableError(UserError, RuntimeError):
    """A registered runner or backend that this machine cannot run (no GPU, no pycuda), and why."""


@dataclass(frozen=True)
class Engine:
    name: str
    role: str                                  # RUNNER | PREFILL
    where: str                                 # "module:Class"
    takes: tuple[str, ...] | None = None       # the constructor's options; None: every option given

    def load(self) -> type:
        module, cls = self.where.split(":")
        return getattr(importlib.import_module(module), cls)

    def availability(self) -> tuple[bool, str]:
        try:
            cls = self.load()
        except ImportError as e:
            return False, f"cannot import {self.where.split(':')[0]}: {e}"
        return cls.availability()

    def create(self, model: Any, **options: Any) -> Any:
        ok, why = self.availability()
        if not ok:
            raise EngineUnavailableError(f"{self.role} {self.name!r} is not available here: {why}")
        given = options if self.takes is None else {k: v for k, v in options.items() if k in self.takes}
        return self.load()(model, **given)


ENGINES = (
    Engine("native", RUNNER, "native.cpu_runner:CpuRunner"),
    Engine("reference", RUNNER, "common.reference.model:ReferenceModel", takes=("kv_type",)),  # no CPU options
    Engine("cpu", PREFILL, "services.prefill.backends.cpu:CPUBackend"),
    Engine("cuda", PREFILL, "services.prefill.backends.cuda:CUDABackend"),
)


def engines(role: str) -> dict[str, Engine]:
    return {e.name: e for e in ENGINES if e.role == role}


def names(role: str) -> tuple[str, ...]:
    """The names a user may give for `role` (the runners' with `auto`)."""
    return (AUTO, *engines(RUNNER)) if role == RUNNER else tuple(engines(role))


def names_text(role: str) -> str:
    """'a, b or c': the choices, as an option's help lists them."""
    *rest, last = names(role)
    return f"{', '.join(rest)} or {last}" if rest else last


def available(role: str) -> dict[str, tuple[bool, str]]:
    return {name: e.availability() for name, e in engines(role).items()}


def _engine(role: str, name: str) -> Engine:
    known = engines(role)
    if name not in known:
        listed = ", ".join(f"{n} ({'ok' if ok else why})" for n, (ok, why) in available(role).items())
        raise UnknownEngineError(f"no {role} named {name!r}; registered: {listed}"
                                 + (f", and {AUTO} (native when it loads)" if role == RUNNER else ""))
    return known[name]


def load_runner(name: str, model: Any, **options: Any) -> tuple[str, Runner]:
    """(name actually used, runner)."""
    if name == AUTO:
        try:
            return "native", _engine(RUNNER, "native").create(model, **options)
        except Exception as e:
            log.warning("native runner unavailable (%s: %s); running the reference model", type(e).__name__, e)
            return "reference", _engine(RUNNER, "reference").create(model, **options)
    return name, _engine(RUNNER, name).create(model, **options)


def create_backend(name: str, model: Any, **options: Any) -> PrefillBackend:
    return _engine(PREFILL, name).create(model, **options)
