"""Shared by the deployment tests: the Debian tools they check with."""
from __future__ import annotations

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
