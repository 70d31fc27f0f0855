"""Settings: config dataclass fields that carry their own help, and the fields every worker shares.

A field made with `setting(default, help)` is a setting: `fermium` (fermium/options.py) makes it
the option `--kebab-name`, read from the environment as FERMIUM_UPPER_NAME, with the field's
default and help. A plain field is not an option. Metadata keys (all optional):

    help     the option's help; a field without it is not an option
    aliases  other names for the same option: flags --alias and FERMIUM_ALIAS (the name it had before)
    path     the option is a path; the config holds it as a str
    unit     a Unit: the option is a float in that unit, the config holds an int of base units
    min      the least value the option accepts
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Unit:
    name: str
    scale: int                   # base units (bytes) per unit

    def to_base(self, value: float | None) -> int | None:
        return None if value is None else int(value * self.scale)

    def from_base(self, value: int | None) -> float | None:
        return None if value is None else value / self.scale


GIB = Unit("GiB", 2 ** 30)
ROUTER_WORKERS = "tcp://127.0.0.1:5560"     # the router's worker inbox, bound there and dialled by workers


def setting(default: Any = dataclasses.MISSING, help: str = "", **metadata: Any) -> Any:
    """A config field that is also a command-line option (see the module docstring)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def model_setting() -> Any:
    return setting(help="GGUF model file; default: the bundled demo model.", path=True)


def worker_token_setting() -> Any:
    """None: common.worker_token's default."""
    return setting(None, "Secret that admits workers, the same on router, prefill and decode; default: "
                         "a token file in this user's state directory (one host).")


def metrics_port_setting() -> Any:
    return setting(0, "Prometheus /metrics port; 0 is off.")


def log_level_setting() -> Any:
    return setting("info", "debug, info, warning or error.")


@dataclass(frozen=True)
class WorkerConfig:
    """What prefill and decode workers share: the model, the router link and the ready handshake."""

    model: str = model_setting()
    router: str = setting(ROUTER_WORKERS, "The router's worker address.")
    listen: str = setting("tcp://127.0.0.1:0", "This worker's inbox (bind); :0 picks a free port.")
    advertise: str | None = setting(None, "Inbox address as other hosts reach it.")
    worker_token: str | None = worker_token_setting()
    ready_timeout: float = setting(30.0, "Seconds to wait for the router's handshake.")
    metrics_port: int = metrics_port_setting()
    log_level: str = log_level_setting()


def settings(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of a config class that are options, by name, in field order."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("help")}


def default(cls: type, name: str) -> Any:
    """The default of one field of a config class."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
