"""Settings: config dataclass fields that carry their own help, and the fields every worker shares.

A field made with `setting(default, help)` is a setting: `fermium` (fermium/options.py) makes it
the option `--kebab-name`, read from the environment as FERMIUM_UPPER_NAME, with the field's
default and help. A plain field is not an option. Metadata keys (all optional):

    help     the option's help; a field without it is not an option
    aliases  other names for the same option: flags --alias and FERMIUM_ALIAS (the name it had before)
    path     the option is a path; the config holds it as a str
    unit     a Unit: the option is a float in that unit, the config holds an int of base units
    min      the least value the option accepts

The context size (`--ctx-size`) is one setting of every service: `context_size` resolves it
against the model, `sequence_memory` (common/sequence_memory.py) is what one sequence holds at
that many tokens, and `check_memory` refuses at start a context that the machine cannot hold. So is the KV cache
type (`--kv-type`, common.kv_cache), which sequence_memory counts in.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import UserError
from common.sequence_memory import SequenceMemory, model_file_bytes, sequence_memory, size_text

if TYPE_CHECKING:
    from common.model.config import ModelConfig


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


def ctx_size_setting() -> Any:
    return setting(0, "Context length in tokens (prompt and generation of one sequence), at most the model's "
                      "context_length; 0 is the model's. The same on router, prefill and decode.",
                   aliases=("max_model_len",), min=0)


def mmproj_setting() -> Any:
    return setting(None, "Vision tower: an mmproj GGUF (llama.cpp's, or fermium convert --mmproj); chat messages "
                         "may then hold image_url parts (image blocks on /v1/messages). The same on router and "
                         "prefill. With --backend cuda it runs on the GPU, its weights and the scratch for its "
                         "largest image taken off --vram-budget, when the text model still fits beside it; "
                         "else on the CPU, with a warning naming the sizes.", path=True)


def kv_type_setting() -> Any:
    from common.kv_cache import DEFAULT_KV_TYPE, KV_TYPES
    return setting(DEFAULT_KV_TYPE, f"KV cache type: {', '.join(KV_TYPES)}. The same on router, prefill and decode.")


@dataclass(frozen=True)
class WorkerConfig:
    """What prefill and decode workers share: the model, the router link and the ready handshake."""

    model: str = model_setting()
    router: str = setting(ROUTER_WORKERS, "The router's worker address.")
    listen: str = setting("tcp://127.0.0.1:0", "This worker's inbox (bind); :0 picks a free port.")
    advertise: str | None = setting(None, "Inbox address as other hosts reach it.")
    worker_token: str | None = worker_token_setting()
    ctx_size: int = ctx_size_setting()
    kv_type: str = kv_type_setting()
    ready_timeout: float = setting(30.0, "Seconds to wait for the router's handshake.")
    metrics_port: int = metrics_port_setting()
    metrics_host: str | None = setting(None, "Address /metrics listens on; default: the --listen address's host.")
    log_level: str = log_level_setting()


def settings(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of a config class that are options, by name, in field order."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("help")}


def default(cls: type, name: str) -> Any:
    """The default of one field of a config class."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# ---- the context size and what it costs

log = logging.getLogger("fermium.config")


class ContextSizeError(UserError, ValueError):
    """A --ctx-size beyond the model's context length, or one the machine cannot hold."""


def context_size(requested: int, cfg: "ModelConfig") -> int:
    """The context length in tokens that --ctx-size `requested` gives this model (0: the model's)."""
    limit = cfg.context_length
    if isinstance(requested, bool) or not isinstance(requested, int) or not 0 <= requested <= limit:
        raise ContextSizeError(f"--ctx-size {requested} is beyond this model's context_length of {limit} tokens; "
                               f"give at most {limit} (0 is the model's)")
    return requested or limit


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes, by key (MemTotal, MemAvailable, ...); {} where it cannot be read."""
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def cgroup_memory_limit(path: str = "/sys/fs/cgroup/memory.max") -> int | None:
    """This process's cgroup v2 memory limit in bytes; None where there is none."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def machine_ram() -> tuple[int, int | None]:
    """(RAM this process may use, RAM available now): MemTotal, or a smaller cgroup limit; and
    MemAvailable (None where unknown)."""
    info = meminfo()
    total = info.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit()
    return (min(total, limit) if limit else total), info.get("MemAvailable")


def check_memory(role: str, mem: SequenceMemory, sequences: int, model_bytes: int, *,
                 batch_option: str | None = "--max-batch", model: Any = None) -> int:
    """Raise ContextSizeError, naming the sizes, when one state at the context size and the model
    file do not fit this machine's RAM: with the --ctx-size that fits, or where none does, the
    smaller files of `model` that would (common/file_types.py). KV grows with each sequence's
    length, so `sequences` at the full context (`batch_option` sets their number) is a worst
    case: past the RAM it is a warning, naming what fits. Returns the bytes that it needs."""
    ram, available = machine_ram()
    room = ram - model_bytes
    if mem.total_bytes > room:
        from common.file_types import files_that_fit
        per_token = mem.kv_bytes_per_token
        fit_ctx = (room - mem.fixed_bytes) // per_token if per_token else 0
        raise ContextSizeError(
            f"{role}: a context of {mem.tokens} tokens needs up to {size_text(mem.total_bytes)} per sequence (KV "
            f"{mem.kv_type} {size_text(mem.kv_bytes)} + recurrent state {size_text(mem.recurrent_bytes)}); with the "
            f"model file's {size_text(model_bytes)} that is {size_text(mem.total_bytes + model_bytes)}, more than this "
            f"machine's {size_text(ram)} of RAM"
            + (f"; lower --ctx-size (--ctx-size {fit_ctx} fits)" if fit_ctx > 0 else files_that_fit(model, ram, mem)))
    need = sequences * mem.total_bytes + model_bytes
    if need > ram:
        fit = f"; {batch_option} {room // mem.total_bytes} would" if batch_option else ""
        log.warning("%s: %d sequences at the full context of %d tokens (%s each) and the model file take %s, "
                    "more than this machine's %s of RAM: long contexts at once may not fit%s",
                    role, sequences, mem.tokens, size_text(mem.total_bytes), size_text(need), size_text(ram), fit)
    elif available is not None and need > available:
        log.warning("%s: %s for %d sequences and the model file is more than the %s of RAM available now",
                    role, size_text(need), sequences, size_text(available))
    return need


def plan_context(role: str, model: Any, requested: int, sequences: int, batch_option: str | None = "--max-batch",
                 kv_type: str = "f32", draft_tokens: int = 0) -> SequenceMemory:
    """What a worker serves: the context `requested` (--ctx-size) resolves to for `model`, and
    one sequence's memory there with KV in `kv_type` (and, with `draft_tokens`, speculative
    decoding's rollback slots and draft KV), checked against the RAM (check_memory) before a
    runner loads."""
    from common.kv_cache import check_kv_type
    kv_type = check_kv_type(kv_type, model.config.head_dim)
    mem = sequence_memory(model.config, context_size(requested, model.config), kv_type, draft_tokens)
    check_memory(role, mem, sequences, model_file_bytes(model), batch_option=batch_option, model=model)
    return mem


def reserve_context(runner: Any, tokens: int) -> None:
    """A runner that can (CpuRunner) makes each KV buffer once, for `tokens` positions."""
    if hasattr(runner, "max_context"):
        runner.max_context = tokens


class ContextModel:
    """A model whose config says `context_length` = the context size: what a worker checks
    requests and states against (common.protocol.checks, common.state.check_state) and sizes
    its wire limits by. Everything else is the model's."""

    def __init__(self, model: Any, ctx_size: int):
        self._model = model
        self.config = dataclasses.replace(model.config, context_length=ctx_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
