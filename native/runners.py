"""Runners by name: each loader takes a GGUFModel and options and returns an object with the
reference model's `new_state()`, `prefill(tokens, state, *, all_logits=False) -> logits` and
`decode(tokens, states) -> logits (B, vocab)`, and a `kv_type` (the option of that name, the
KV cache type of every state it makes and takes). Decode, the `cpu` prefill backend, `fermium
generate` and the benchmarks load theirs here."""
from __future__ import annotations

import logging
from typing import Any, Callable

from common.errors import UserError

log = logging.getLogger("fermium.runners")

RUNNERS: dict[str, Callable[..., Any]] = {}
AUTO = "auto"   # native when it loads, else reference


class UnknownRunnerError(UserError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_runner(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(loader: Callable[..., Any]) -> Callable[..., Any]:
        RUNNERS[name] = loader
        return loader
    return wrap


@register_runner("native")
def _native(model: Any, **options: Any) -> Any:
    from native.cpu_runner import CpuRunner
    return CpuRunner(model, **options)


@register_runner("reference")
def _reference(model: Any, **options: Any) -> Any:
    from common.reference.model import ReferenceModel
    return ReferenceModel(model, kv_type=options.get("kv_type", "f32"))   # the CPU options (threads, ...) do not apply


def runner_names() -> tuple[str, ...]:
    return (AUTO, *RUNNERS)


def load_runner(name: str, model: Any, **options: Any) -> tuple[str, Any]:
    """(name actually used, runner)."""
    if name == AUTO:
        try:
            return "native", RUNNERS["native"](model, **options)
        except Exception as e:
            log.warning("native runner unavailable (%s: %s); running the reference model",
                        type(e).__name__, e)
            return "reference", RUNNERS["reference"](model, **options)
    if name not in RUNNERS:
        raise UnknownRunnerError(f"no runner named {name!r}; choose one of: {', '.join(runner_names())}")
    return name, RUNNERS[name](model, **options)
