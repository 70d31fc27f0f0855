"""Builds a native/cuda/*_host.cpp program (a .cu compiled for the CPU, native/cuda/host_launch.h)
for the host-run kernel tests; skips the test module when g++ lacks C++20 <barrier>."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ not on PATH")


def host_program(tmp: Path, name: str, *flags: str) -> Path:
    """native/cuda/{name}.cpp built into tmp with g++ -std=c++20 -pthread and `flags`."""
    probe = tmp / "probe.cpp"
    probe.write_text("#include <barrier>\nint main() { std::barrier<> b(1); b.arrive_and_wait(); }\n")
    if subprocess.run([GXX, "-std=c++20", "-pthread", str(probe), "-o", str(tmp / "probe")],
                      capture_output=True).returncode != 0:
        pytest.skip("g++ without C++20 <barrier>")
    exe, src = tmp / name, REPO / "native/cuda" / f"{name}.cpp"
    run = subprocess.run([GXX, "-std=c++20", "-w", "-pthread", *flags, "-I", str(src.parent), str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return exe
