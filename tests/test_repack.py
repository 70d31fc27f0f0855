"""The repack cache beside the model: built once, reused, rebuilt when stale or corrupt, never
trusted; and the native runner reading it decodes as it does from the GGUF layout."""
from __future__ import annotations

import logging
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from native import cpu_lib
from native import cpu_repack as repack
from native.cpu_runner import CpuRunner
from tests import kernel_calls

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# The repacked kernels do each row's integer sums exactly, as the GGUF-layout ones do; only the
# float order of the block scales differs: a few 1e-7 of the largest logit on most tokens. Once
# in a while that tips an 8-bit activation rounding or a router near-tie, and the token's logits
# move by up to a percent or so (the bound of the quantized-file tests, test_cpu_runner.py).
FLOAT_ORDER_REL_TOL = 1e-5
NEAR_TIE_REL_TOL = 0.1
MIN_ARGMAX_AGREEMENT = 0.9


@pytest.fixture(params=["q4_0", "q4_k_m"])
def model_path(tmp_path, request):
    return write_synthetic(tmp_path / f"{request.param}.gguf", layers=2, recipe=request.param, widths=TINY)


def repackable(t, layouts: dict[int, int] | None = None) -> bool:
    return repack.repack_layout(t, repack.layouts_for() if layouts is None else layouts) is not None


def repackable_names(model: GGUFModel) -> list[str]:
    return [n for n, t in model.tensors.items() if repackable(t)]


def test_builds_beside_the_model_with_every_repackable_matrix_but_the_embedding(model_path):
    model = GGUFModel(model_path)
    cache = repack.open_cache(model)
    assert cache.path == model_path.with_name(model_path.name + repack.SUFFIX) and cache.path.is_file()
    names = repackable_names(model)
    assert "token_embd.weight" not in names and any("ffn_gate_exps" in n for n in names)
    assert sorted(cache.views) == sorted(names)
    for name in names:
        t = model.tensor(name)
        assert cache.layouts[name] == repack.layouts_for()[int(t.qtype)]
        expect = cpu_lib.repack(cache.layouts[name], t.raw.reshape(-1, t.row_bytes), t.shape[-1])
        assert np.array_equal(cache.views[name].reshape(expect.shape), expect), name


def test_a_valid_cache_is_reused(model_path, monkeypatch):
    repack.open_cache(GGUFModel(model_path))
    monkeypatch.setattr(repack, "build", lambda *a, **k: pytest.fail("rebuilt a valid cache"))
    assert repack.open_cache(GGUFModel(model_path)) is not None


def corrupt_data(path: Path) -> None:
    with open(path, "r+b") as f:
        data_start = repack.PREFIX.unpack(f.read(repack.PREFIX.size))[3]
        f.seek(data_start + 100)
        byte = f.read(1)
        f.seek(data_start + 100)
        f.write(bytes([byte[0] ^ 0x10]))


def bump_version(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", repack.VERSION + 1))


def touch_model(cache_path: Path) -> None:
    model = cache_path.with_name(cache_path.name.removesuffix(repack.SUFFIX))
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def corrupt_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(repack.PREFIX.size + 20)
        byte = f.read(1)
        f.seek(repack.PREFIX.size + 20)
        f.write(bytes([byte[0] ^ 0x01]))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4096)


@pytest.mark.parametrize("damage, reason", [
    (corrupt_data, "fails its checksum"),
    (corrupt_header, "header fails the checksum"),
    (bump_version, "cache version"),
    (touch_model, "another version of the model"),
    (truncate, "bytes, expected"),
    (lambda p: p.write_bytes(b"not a cache"), "shorter than its prefix"),
    (lambda p: p.write_bytes(b""), "shorter than its prefix"),
    (lambda p: p.write_bytes(b"X" * 64), "not a Fermium repack cache"),
])
def test_a_stale_or_corrupt_cache_is_rebuilt(model_path, damage, reason, caplog):
    first = repack.open_cache(GGUFModel(model_path))
    expect = {n: v.copy() for n, v in first.views.items()}
    damage(first.path)
    with caplog.at_level(logging.WARNING, logger="fermium.decode"):
        cache = repack.open_cache(GGUFModel(model_path))
    assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    for name, view in cache.views.items():
        assert np.array_equal(view, expect[name]), name
    assert not list(model_path.parent.glob("*.tmp.*"))   # no temporary file left behind


def test_an_unwritable_model_folder_caches_in_the_user_cache(model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(repack.os, "access", lambda p, mode: False)
    cache = repack.open_cache(GGUFModel(model_path))
    assert cache.path.parent == tmp_path / "xdg" / "fermium" and cache.path.is_file()


def test_a_cache_that_cannot_be_written_leaves_the_gguf_layout(model_path, monkeypatch, caplog):
    def full_disk(path, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repack, "build", full_disk)
    with caplog.at_level(logging.WARNING, logger="fermium.decode"):
        assert repack.open_cache(GGUFModel(model_path)) is None
    assert any("No space left" in r.getMessage() for r in caplog.records)
    eng = CpuRunner(GGUFModel(model_path), threads=1)
    assert eng.repacked is None and eng.decode([1], [eng.new_state()]).shape == (1, TINY.vocab)


def test_a_model_without_repackable_types_needs_no_cache(tmp_path):
    path = write_synthetic(tmp_path / "q8.gguf", layers=2, recipe="q8_0", widths=TINY)
    assert repack.open_cache(GGUFModel(path)) is None
    assert not list(tmp_path.glob("*" + repack.SUFFIX))


def test_prefault_leaves_the_pages_of_repacked_tensors_alone(model_path):
    model = GGUFModel(model_path)
    ranges = repack.source_ranges(model, repackable_names(model))
    spans = model.file._pages_outside(ranges)
    page = os.sysconf("SC_PAGE_SIZE")
    for start, end in ranges:                 # every whole page inside a range is skipped
        lo, hi = -(-start // page) * page, end // page * page
        assert all(e <= lo or s >= hi for s, e in spans)
    covered = sum(e - s for s, e in spans)
    skipped = sum(max(0, end // page * page - -(-start // page) * page) for start, end in ranges)
    assert covered + skipped == model_path.stat().st_size


def test_a_cache_without_the_tensors_wanted_now_is_rebuilt_with_them_added(model_path, monkeypatch, caplog):
    """A reader of fewer types reuses a fuller cache; one that reads more rebuilds it with
    everything, once."""
    model, avx = GGUFModel(model_path), repack.REPACK_LAYOUTS["avx2"]
    q6 = repack.open_cache(model, {14: avx[14]})
    assert q6.views and all(model.tensor(n).qtype == 14 for n in q6.views)
    with caplog.at_level(logging.INFO, logger="fermium.decode"):
        full = repack.open_cache(GGUFModel(model_path), avx)
    assert any("lacks" in r.getMessage() for r in caplog.records)
    assert sorted(full.views) == sorted(n for n, t in model.tensors.items() if repackable(t, avx))
    monkeypatch.setattr(repack, "build", lambda *a, **k: pytest.fail("rebuilt a cache that holds them"))
    for types in ((14,), (2, 12), (2, 12, 14)):
        again = repack.open_cache(GGUFModel(model_path), {q: avx[q] for q in types})
        assert sorted(again.views) == sorted(n for n in full.views if model.tensor(n).qtype in types)


def test_a_tensor_held_in_another_layout_is_rebuilt_in_the_one_wanted(model_path, caplog):
    """SSSE3 and the AVX ISAs read Q4_0 and Q4_K in different layouts: a switch rebuilds those
    tensors in the layout wanted now, keeps the tensors both read alike, and never hands out
    bytes in the other layout."""
    model = GGUFModel(model_path)
    for isa in ("avx2", "ssse3", "avx2"):
        layouts = repack.REPACK_LAYOUTS[isa]
        with caplog.at_level(logging.INFO, logger="fermium.decode"):
            caplog.clear()
            cache = repack.open_cache(GGUFModel(model_path), layouts)
        assert cache.views and cache.layouts == {n: layouts[int(model.tensor(n).qtype)] for n in cache.views}
        for name, view in cache.views.items():
            t = model.tensor(name)
            expect = cpu_lib.repack(cache.layouts[name], t.raw.reshape(-1, t.row_bytes), t.shape[-1])
            assert np.array_equal(view.reshape(expect.shape), expect), (isa, name)
    assert any("lacks" in r.getMessage() for r in caplog.records)


def assert_decodes_the_same(plain: CpuRunner, packed: CpuRunner) -> None:
    """The same logits token after token, up to float order; and a batch as each of its
    sequences alone."""
    errors, agree = [], []
    for first in (1, 200, 300, 400):
        a, b, token = plain.new_state(), packed.new_state(), first
        for _ in range(6):
            la, lb = plain.decode([token], [a]), packed.decode([token], [b])
            errors.append(np.abs(la - lb).max() / np.abs(la).max())
            agree.append(la.argmax() == lb.argmax())
            assert packed.last_bytes == plain.last_bytes
            token = int(la.argmax())
    assert np.median(errors) <= FLOAT_ORDER_REL_TOL and max(errors) <= NEAR_TIE_REL_TOL, errors
    assert np.mean(agree) >= MIN_ARGMAX_AGREEMENT
    tokens = [1, 200, 300, 400, 5]
    batch, alone = [packed.new_state() for _ in tokens], [packed.new_state() for _ in tokens]
    errors = []
    for _ in range(6):
        lb = packed.decode(tokens, batch)
        la = np.concatenate([packed.decode([t], [s]) for t, s in zip(tokens, alone)])
        errors += list(np.abs(la - lb).max(axis=1) / np.abs(la).max())
        tokens = la.argmax(axis=1).tolist()
    assert np.median(errors) <= FLOAT_ORDER_REL_TOL and max(errors) <= NEAR_TIE_REL_TOL, errors


@pytest.mark.parametrize("isa", [i for i in repack.REPACK_LAYOUTS if i in cpu_lib.supported_isas()])
def test_runner_decodes_the_same_from_the_cache(model_path, isa):
    """Each ISA reads the types of REPACK_LAYOUTS from the cache in its layouts, the rest from the
    GGUF file."""
    with kernel_calls.isa_restored():
        plain = CpuRunner(GGUFModel(model_path), threads=2, isa=isa, repack=False)
        packed = CpuRunner(GGUFModel(model_path), threads=2, isa=isa, repack=True)
        assert packed.repacked is not None and plain.repacked is None
        layouts = repack.REPACK_LAYOUTS[isa]
        assert packed.repacked.layouts == {n: layouts[int(packed.model.tensor(n).qtype)] for n in packed.repacked.views}
        assert_decodes_the_same(plain, packed)


@pytest.mark.skipif("avx2" not in cpu_lib.supported_isas(), reason="no AVX2 here")
def test_the_environment_can_turn_the_repack_off(model_path, monkeypatch):
    monkeypatch.setenv("FERMIUM_REPACK", "0")
    assert CpuRunner(GGUFModel(model_path), threads=1).repacked is None
    assert not list(model_path.parent.glob("*" + repack.SUFFIX))
    monkeypatch.setenv("FERMIUM_REPACK", "1")
    assert CpuRunner(GGUFModel(model_path), threads=1).repacked is not None


def test_the_generic_kernels_read_the_gguf_layout(model_path):
    with kernel_calls.isa_restored():
        assert CpuRunner(GGUFModel(model_path), threads=1, isa="generic").repacked is None


@pytest.mark.parametrize("shape, isa, expect", [
    ((512, 2048), "ssse3", "FM_Q4_0P"), ((512, 2048), "avx2", "FM_Q4_0X8"),
    ((512, 2080), "ssse3", None),        # 65 blocks of 32: no whole Q4_0p group of 128 values
    ((508, 2048), "avx2", None),         # rows that fill no whole group of 8
    ((2048,), "ssse3", None)])           # a vector
def test_a_matrix_is_repacked_only_in_whole_groups_and_blocks(shape, isa, expect):
    t = SimpleNamespace(qtype=2, shape=shape, name="blk.0.ffn_gate_exps.weight")
    layout = repack.repack_layout(t, repack.REPACK_LAYOUTS[isa])
    assert layout == (None if expect is None else getattr(cpu_lib.lib, expect))
