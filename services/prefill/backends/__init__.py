"""Prefill backends, registered by name (plugin style).

A backend class has `name`, a classmethod `availability() -> (ok, reason)`, a `kv_type`
(common.kv_cache: its constructor takes it, and the states it fills keep KV in it), the reference
model's `prefill(tokens, state, *, all_logits=False, mm=None) -> logits` (`mm`: a prompt's images,
common/reference/multimodal.py), its `prefill_with_checkpoints(tokens, state, checkpoints, *, mm=None,
progress=None) -> (last logits, [common.state.Checkpoint])`: the states at those positions
captured in the same passes over the weights, `progress()` called per chunk or pass; and
`stats() -> dict` of cumulative numbers that the service exports as metrics (`passes`: the passes
over the weights, of the backend's own size). Modules listed in BACKEND_MODULES
register themselves on import; one that fails to import is reported as unavailable.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from common.errors import UserError

_BACKENDS: dict[str, type] = {}
_IMPORT_ERRORS: dict[str, str] = {}

# name -> module that registers it
BACKEND_MODULES = {"cpu": "services.prefill.backends.cpu", "cuda": "services.prefill.backends.cuda"}


class UnknownBackendError(UserError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class BackendUnavailableError(UserError, RuntimeError):
    """A registered backend that this machine cannot run (no GPU, no pycuda), and why."""


def register_backend(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.name = name
        _BACKENDS[name] = cls
        return cls
    return wrap


def _load_all() -> None:
    for name, module in BACKEND_MODULES.items():
        if name in _BACKENDS or name in _IMPORT_ERRORS:
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            _IMPORT_ERRORS[name] = f"cannot import {module}: {e}"


def available_backends() -> dict[str, tuple[bool, str]]:
    _load_all()
    out = {name: cls.availability() for name, cls in _BACKENDS.items()}
    out.update({name: (False, why) for name, why in _IMPORT_ERRORS.items() if name not in out})
    return out


def create_backend(name: str, model: Any, **options: Any):
    _load_all()
    if name not in _BACKENDS:
        known = ", ".join(f"{n} ({'ok' if ok else why})" for n, (ok, why) in available_backends().items())
        raise UnknownBackendError(f"no prefill backend named {name!r}; registered: {known}")
    cls = _BACKENDS[name]
    ok, why = cls.availability()
    if not ok:
        raise BackendUnavailableError(f"prefill backend {name!r} is not available here: {why}")
    return cls(model, **options)
