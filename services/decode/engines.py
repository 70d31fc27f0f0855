"""Decode engines by name: each loader takes a GGUFModel and returns an object with the
reference engine's `decode(tokens, states) -> logits (B, vocab)`."""
from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("fermium.decode")


def _native(model: Any) -> Any:
    from .native_engine import NativeEngine
    return NativeEngine(model)


def _reference(model: Any) -> Any:
    from common.engine.reference import ReferenceEngine
    return ReferenceEngine(model)


ENGINES: dict[str, Callable[[Any], Any]] = {"native": _native, "reference": _reference}


def load_engine(name: str, model: Any) -> tuple[str, Any]:
    """(name actually used, engine). `auto` is native when it loads, else reference."""
    if name == "auto":
        try:
            return "native", _native(model)
        except Exception as e:
            log.warning("native engine unavailable (%s: %s); decoding with the reference engine",
                        type(e).__name__, e)
            return "reference", _reference(model)
    if name not in ENGINES:
        raise KeyError(f"no decode engine named {name!r}; choose one of: auto, {', '.join(ENGINES)}")
    return name, ENGINES[name](model)
