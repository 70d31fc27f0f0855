"""The repack cache's build lock: of two processes that open a fresh model's cache at once, one
builds and the other waits, then opens what the first built; builds that died leave nothing
behind."""
from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from native import cpu_lib
from native import cpu_repack as repack
from native import cpu_repack_lock as repack_lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUILD_DELAY_S = 1.5          # long enough that the second process finds the build under way
START_TIMEOUT_S = 60
# each child opens the cache when the go file appears, and prints a digest of what it mapped
CHILD = """
import hashlib, logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from common.model.gguf_file import GGUFModel
from native import cpu_repack as repack, cpu_repack_lock as repack_lock
repack_lock.WAIT_LOG_S = 0.2
build = repack.build
def slow_build(*args, **kwargs):
    time.sleep(float(sys.argv[3]))
    build(*args, **kwargs)
repack.build = slow_build
model, go = GGUFModel(Path(sys.argv[1])), Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
cache = repack.open_cache(model)
h = hashlib.sha256()
for name in sorted(cache.views):
    h.update(name.encode() + cache.views[name].tobytes())
print(h.hexdigest(), flush=True)
"""


@pytest.fixture
def model_path(tmp_path):
    return write_synthetic(tmp_path / "q4_0.gguf", layers=2, recipe="q4_0", widths=TINY)


def digest(cache: repack.RepackCache) -> str:
    h = hashlib.sha256()
    for name in sorted(cache.views):
        h.update(name.encode() + cache.views[name].tobytes())
    return h.hexdigest()


def test_two_processes_at_once_build_once_and_map_the_same_cache(model_path, tmp_path, monkeypatch):
    go = tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(model_path), str(go), str(BUILD_DELAY_S)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    for c in children:
        assert c.stdout.readline().strip() == "ready"
    go.touch()
    results = [c.communicate(timeout=START_TIMEOUT_S) for c in children]
    assert [c.returncode for c in children] == [0, 0], [err for _, err in results]
    logs = [err for _, err in results]
    builders = [i for i, err in enumerate(logs) if "building the repack cache" in err]
    assert len(builders) == 1, logs
    waiter = logs[1 - builders[0]]
    assert f"waiting for process {children[builders[0]].pid}, which builds the repack cache" in waiter, waiter
    assert "GiB written" in waiter

    monkeypatch.setattr(repack, "build", lambda *a, **k: pytest.fail("rebuilt the cache that was built"))
    cache = repack.open_cache(GGUFModel(model_path))
    assert [out.strip() for out, _ in results] == [digest(cache)] * 2
    model = GGUFModel(model_path)
    for name, view in cache.views.items():
        t = model.tensor(name)
        expect = cpu_lib.repack(cache.layouts[name], t.raw.reshape(-1, t.row_bytes), t.shape[-1])
        assert np.array_equal(view.reshape(expect.shape), expect), name
    assert not repack_lock.tmp_files(cache.path)


def orphan(model_path: Path, pid: int = 999_999) -> Path:
    path = model_path.with_name(f"{model_path.name}{repack.SUFFIX}.tmp.{pid}")
    path.write_bytes(b"\0" * 4096)
    return path


def test_a_dead_builders_temporary_file_is_removed_when_building(model_path):
    left = orphan(model_path)
    assert repack.open_cache(GGUFModel(model_path)) is not None
    assert not left.exists()


def test_a_dead_builders_temporary_file_is_removed_beside_a_valid_cache(model_path, monkeypatch):
    repack.open_cache(GGUFModel(model_path))
    left = orphan(model_path)
    monkeypatch.setattr(repack, "build", lambda *a, **k: pytest.fail("rebuilt a valid cache"))
    assert repack.open_cache(GGUFModel(model_path)) is not None
    assert not left.exists()


def test_a_live_builders_temporary_file_is_left_alone(model_path):
    cache = repack.open_cache(GGUFModel(model_path))
    with repack_lock.build_lock(cache.path):   # a build under way, in another open file
        building = orphan(model_path, pid=1)
        repack_lock.clean_if_idle(cache.path)
        assert building.exists()
    repack_lock.clean_if_idle(cache.path)
    assert not building.exists()


def test_the_lock_waits_for_its_holder(model_path):
    """A second process blocks until the first lets go, and then takes the lock."""
    cache = model_path.with_name(model_path.name + repack.SUFFIX)
    code = ("import sys, time; from pathlib import Path; from native.cpu_repack_lock import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(0.5); print('letting go', flush=True)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(cache)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with repack_lock.build_lock(cache):
        assert select.select([holder.stdout], [], [], 0)[0], "took the lock while the holder held it"
        assert holder.stdout.readline().strip() == "letting go"
        assert repack_lock.lock_path(cache).read_text() == str(os.getpid())
    assert holder.wait(10) == 0
