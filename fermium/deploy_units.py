"""Render deploy/systemd's units for one machine: paths, user, environment file, CPU placement;
and the environment file itself, from deploy/fermium.env.example with a fresh worker token.

The checked-in units are complete for the defaults (/opt/fermium, user `fermium`,
/etc/fermium/fermium.env); rendering rewrites whole directives, never fragments of text, so a
rendered unit is the checked-in one with those values changed.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UNIT_DIR = REPO / "deploy" / "systemd"
ENV_EXAMPLE = REPO / "deploy" / "fermium.env.example"
TOKEN_LINE = "FERMIUM_WORKER_TOKEN="
UNITS = ("fermium-router.service", "fermium-prefill.service", "fermium-decode.service", "fermium.target")
DEFAULT_PREFIX = "/opt/fermium"
DEFAULT_EXECUTABLE = f"{DEFAULT_PREFIX}/.venv/bin/fermium"
NUMA_UNITS = ("fermium-prefill.service", "fermium-decode.service")
CPU_LIST = re.compile(r"^\d+(-\d+)?([ ,]\d+(-\d+)?)*$")


@dataclass(frozen=True)
class UnitSettings:
    prefix: Path = Path(DEFAULT_PREFIX)      # a checkout or install with .venv/bin/fermium or bin/fermium
    user: str = "fermium"
    env_file: Path = Path("/etc/fermium/fermium.env")
    decode_cpus: str | None = None           # CPUAffinity of the decode worker, e.g. "0-7" or "0,2,4,6"
    numa_interleave: bool = False            # NUMAPolicy=interleave for prefill and decode

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_-]*\$?", self.user):
            raise ValueError(f"{self.user!r} is not a valid user name for User=")
        if self.decode_cpus is not None and not CPU_LIST.match(self.decode_cpus):
            raise ValueError(f"--decode-cpus {self.decode_cpus!r}: give CPU numbers and ranges, e.g. 0-7 or 0,2,4,6")
        if not self.prefix.is_absolute() or not self.env_file.is_absolute():
            raise ValueError("--prefix and --env-file must be absolute paths (systemd needs them)")

    @property
    def executable(self) -> Path:
        for candidate in (self.prefix / "bin" / "fermium", self.prefix / ".venv" / "bin" / "fermium"):
            if candidate.exists():
                return candidate
        return self.prefix / ".venv" / "bin" / "fermium"


def _rewrite(line: str, name: str, s: UnitSettings) -> str:
    key, sep, value = line.partition("=")
    if not sep:
        return line
    if key in ("User", "Group"):
        return f"{key}={s.user}"
    if key == "EnvironmentFile":
        return f"EnvironmentFile={s.env_file}"
    if key == "ExecStart" and value.startswith(DEFAULT_EXECUTABLE):
        return f"ExecStart={s.executable}{value[len(DEFAULT_EXECUTABLE):]}"
    if key == "Documentation" and value.startswith(f"file:{DEFAULT_PREFIX}/"):
        return f"Documentation=file:{s.prefix}/{value[len(f'file:{DEFAULT_PREFIX}/'):]}"
    if key == "#CPUAffinity" and name == "fermium-decode.service" and s.decode_cpus:
        return f"CPUAffinity={s.decode_cpus}"
    if key in ("#NUMAPolicy", "#NUMAMask") and name in NUMA_UNITS and s.numa_interleave:
        return line[1:]
    return line


def render_unit(name: str, settings: UnitSettings, source: Path = UNIT_DIR) -> str:
    path = source / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `fermium deploy install` renders the units of a "
                                "Fermium checkout (its deploy/systemd folder)")
    lines = path.read_text().splitlines()
    return "\n".join(_rewrite(line, name, settings) for line in lines) + "\n"


def render_env(token: str, source: Path = ENV_EXAMPLE) -> str:
    """The example environment file with `token` as its FERMIUM_WORKER_TOKEN."""
    lines = source.read_text().splitlines()
    out = [f"{TOKEN_LINE}{token}" if line.startswith(TOKEN_LINE) else line for line in lines]
    if out == lines:
        raise ValueError(f"{source} has no {TOKEN_LINE} line to fill in")
    return "\n".join(out) + "\n"


def write_env(path: Path, token: str, *, group: str | None = None, force: bool = False) -> None:
    """Write the environment file, mode 0640 (group: the service user's group may read it)."""
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; edit it, or pass --force to replace it (and its token)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render_env(token))
        if group:
            shutil.chown(tmp, group=group)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def render_all(settings: UnitSettings, output_dir: Path) -> list[Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNITS:
        out = output_dir / name
        out.write_text(render_unit(name, settings))
        written.append(out)
    return written
