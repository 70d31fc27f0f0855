"""Shared by the deployment tests: the Debian tools they check with."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from tests.conftest import REPO


def system_tool(name: str) -> str:
    """Path of a Debian tool the deployment is checked with; installs it (as root) when missing."""
    if shutil.which(name) is None:
        subprocess.run(["bash", str(REPO / "tools" / "ci_system_deps.sh")], check=False)
    path = shutil.which(name)
    assert path, (f"{name} is not installed: run `apt-get install -y --no-install-recommends systemd prometheus` "
                  "(tools/ci_system_deps.sh, which `make setup` runs as root)")
    return path


def read_env_file(text: str) -> dict[str, str]:
    """systemd EnvironmentFile= lines: KEY=VALUE, # comments; a later line wins."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip().strip('"')
    return env


def unit_command(unit_text: str, env_file_text: str) -> tuple[list[str], dict[str, str]]:
    """A unit's ExecStart argv and environment as systemd builds them: Environment= first,
    EnvironmentFile= over it, then "${VAR}" words replaced by exactly one argument each."""
    env: dict[str, str] = {}
    exec_start = None
    for line in unit_text.splitlines():
        key, _, value = line.partition("=")
        if key == "Environment":
            env.update(read_env_file("\n".join(shlex.split(value))))
        elif key == "EnvironmentFile":
            env.update(read_env_file(env_file_text))
        elif key == "ExecStart":
            exec_start = value
    assert exec_start, "the unit has no ExecStart"
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word) for word in shlex.split(exec_start)]
    return argv, env
