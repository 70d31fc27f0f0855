"""Staging of the streamed experts (native/cuda/staging.py) under tests/cuda_emulator: read from the
file into registered anonymous memory, or copied into page-locked buffers, byte for byte the same
and giving the same prefill; a refused registration steps down to copy, and then to pageable."""
from __future__ import annotations

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.state import SequenceState
from native.cuda import staging
from native.cuda.plan import EXPERT_TENSORS
from services.prefill.backends import cuda as cuda_backend

from .cuda_emulator import emulate_cuda
from .gpu.tiny_gguf import TinySpec, build
from .test_cuda_backend_emulated import LOGITS_ATOL, budget_for, reference


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return GGUFModel(build(tmp_path_factory.mktemp("tiny") / "qwen35moe.gguf", TinySpec()))


@pytest.fixture()
def emulated(monkeypatch):
    driver = emulate_cuda(monkeypatch)
    return driver


TOKENS = list(np.random.default_rng(3).integers(0, 512, 90))


def prefill(model, share: float, staging_option: str):
    """Both calls of tests/test_cuda_backend_emulated's pattern: logits and the backend."""
    backend = cuda_backend.CUDABackend(model, max_context=512, vram_budget=budget_for(model, share, 64),
                                       pass_tokens=64, staging=staging_option)
    state = SequenceState.empty(model.config)
    split = len(TOKENS) * 2 // 3
    return [backend.prefill(TOKENS[:split], state), backend.prefill(TOKENS[split:], state)], backend


def expected_src(model, P: int) -> dict:
    return {(i, t): model.tensor(f"blk.{i}.{t}.weight").raw[P:]
            for i in range(model.config.n_layers) for t in EXPERT_TENSORS}


@pytest.mark.parametrize("share", [0.0, 0.5], ids=["all-streamed", "half-pinned"])
def test_register_and_copy_stage_the_same_bytes_and_give_the_same_prefill(model, emulated, monkeypatch, share):
    reads = []
    real_read = staging.read_into
    monkeypatch.setattr(staging, "read_into", lambda fd, dst, off: (reads.append(off), real_read(fd, dst, off)))
    out, hosts = {}, {}
    for how in ("register", "copy"):
        out[how], backend = prefill(model, share, how)
        hosts[how] = host = backend.host
        assert host.method == how and host.pinned and backend.stats()["staged_bytes"] == host.nbytes > 0
        assert host.bytes_by[how] == host.nbytes and backend.stats()["staging_seconds"] > 0
        want = expected_src(model, backend.plan.pinned_experts)
        assert host.src.keys() == want.keys()
        for key, raw in want.items():
            assert host.src[key].shape == raw.shape and np.array_equal(host.src[key], raw), key
            assert emulated.is_locked(host.src[key]), f"{how}: {key} is not in page-locked memory"
            assert not np.shares_memory(host.src[key], raw)            # a copy, not the mapping
        staged = dict(host.src)
        backend.close()
        if how == "register":                                         # close() unregisters
            assert not any(emulated.is_locked(a) for a in staged.values())
    # the register path read every streamed tensor from the file at its own offset, not via the mapping
    assert len(reads) == len(want) and len(set(reads)) == len(reads)
    for a, b in zip(out["register"], out["copy"]):
        np.testing.assert_array_equal(a, b)
    want, _ = reference(model, TOKENS, len(TOKENS) * 2 // 3)
    for w, g in zip(want, out["register"]):
        np.testing.assert_allclose(g, w, atol=LOGITS_ATOL)


def test_a_refused_registration_falls_back_to_copy_with_a_warning(model, emulated, monkeypatch, caplog):
    def refuse(ary, flags=0):
        raise RuntimeError("cuMemHostRegister failed: operation not supported")
    monkeypatch.setattr(emulated, "register_host_memory", refuse)
    with caplog.at_level("INFO", logger="fermium.prefill.cuda"):
        got, backend = prefill(model, 0.0, "auto")
    host = backend.host
    assert host.method == "copy" and host.pinned and host.bytes_by["register"] == 0
    assert "registration refused (cuMemHostRegister failed: operation not supported)" in caplog.text
    assert "staged by copy (staging=auto)" in caplog.text
    assert all(emulated.is_locked(a) for a in host.src.values())
    want, _ = reference(model, TOKENS, len(TOKENS) * 2 // 3)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=LOGITS_ATOL)
    with pytest.raises(RuntimeError, match="staging=register: the driver refused: cuMemHostRegister failed"):
        prefill(model, 0.0, "register")


def test_a_limit_reached_part_way_steps_down_tensor_by_tensor(model, emulated, monkeypatch, caplog):
    """Two tensors registered, then registration and page-locking refused: the rest stay pageable."""
    calls = []
    register = emulated.register_host_memory

    def limited(ary, flags=0):
        calls.append(ary.nbytes)
        if len(calls) > 2:
            raise MemoryError("locked-memory limit reached")
        return register(ary, flags)

    def refuse(*args):
        raise MemoryError("locked-memory limit reached")
    monkeypatch.setattr(emulated, "register_host_memory", limited)
    monkeypatch.setattr(emulated, "pagelocked_empty", refuse)
    with caplog.at_level("WARNING", logger="fermium.prefill.cuda"):
        got, backend = prefill(model, 0.0, "auto")
    host = backend.host
    assert host.method == "register+pageable" and not host.pinned
    assert backend.stats()["pinned_host"] == 0 and "registration refused" in caplog.text and "pageable" in caplog.text
    want = expected_src(model, 0)
    locked = [emulated.is_locked(host.src[k]) for k in want]
    assert locked[:2] == [True, True] and not any(locked[2:])
    for key, raw in want.items():
        assert np.array_equal(host.src[key], raw)
    ref, _ = reference(model, TOKENS, len(TOKENS) * 2 // 3)
    for w, g in zip(ref, got):
        np.testing.assert_allclose(g, w, atol=LOGITS_ATOL)


def test_an_unknown_staging_is_refused(model, emulated):
    with pytest.raises(ValueError, match="staging 'mmap': choose one of auto, register, copy"):
        prefill(model, 0.0, "mmap")


def test_anonymous_memory_is_whole_pages_and_reads_the_file(model, tmp_path):
    import mmap
    buf = staging.anonymous(5000)
    assert buf.nbytes == 2 * mmap.PAGESIZE and buf.__array_interface__["data"][0] % mmap.PAGESIZE == 0
    raw = model.tensor("blk.1.ffn_up_exps.weight").raw[3:]
    offset = staging.file_offset(model, raw)
    assert offset is not None and staging.file_offset(model, raw.copy()) is None
    dst = staging.anonymous(raw.nbytes)[:raw.nbytes]
    with open(model.path, "rb") as f:
        staging.read_into(f.fileno(), memoryview(dst), offset)
    assert np.array_equal(dst, raw.reshape(-1))
    with open(model.path, "rb") as f, pytest.raises(OSError, match="ends before byte"):
        staging.read_into(f.fileno(), memoryview(staging.anonymous(64)[:64]), model.path.stat().st_size - 10)
