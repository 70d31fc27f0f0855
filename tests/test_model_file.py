"""Model files: the config comes from metadata; a wrong file gets an error that names the problem."""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from common.metrics import RouterMetrics
from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel
from services.router.engine.prefix_cache import build_snapshot_cache
from tests.stack_helpers import write_tiny_gguf


def write_gguf(path, arch: str, keys: dict, tensors: dict | None = None):
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    for name, array in (tensors or {"token_embd.weight": np.zeros((8, 16), np.float32)}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


KEYS = {"context_length": 256, "embedding_length": 16, "block_count": 5, "nextn_predict_layers": 1,
        "attention.head_count": 2, "attention.head_count_kv": 1, "attention.key_length": 8,
        "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_count": 2, "rope.freq_base": 1e7,
        "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.state_size": 4, "ssm.group_count": 2,
        "ssm.time_step_rank": 4, "ssm.inner_size": 16, "expert_count": 4, "expert_used_count": 2,
        "expert_feed_forward_length": 8, "expert_shared_feed_forward_length": 8}


def test_config_reads_metadata_and_drops_the_mtp_block(tmp_path):
    cfg = GGUFModel(write_gguf(tmp_path / "m.gguf", "qwen35moe", KEYS)).config
    assert (cfg.n_layers, cfg.n_nextn_layers, cfg.vocab_size) == (4, 1, 8)
    assert cfg.full_layers == [3] and cfg.linear_layers == [0, 1, 2]
    assert cfg.conv_channels == 2 * 2 * 4 + 4 * 4
    assert [cfg.key_head_of(h) for h in range(4)] == [0, 1, 0, 1]          # tiled


def test_qwen3next_groups_value_heads(tmp_path):
    cfg = GGUFModel(write_gguf(tmp_path / "m.gguf", "qwen3next", KEYS)).config
    assert [cfg.key_head_of(h) for h in range(4)] == [0, 0, 1, 1]


def test_unknown_architecture_names_file_and_supported(tmp_path):
    path = write_gguf(tmp_path / "llama.gguf", "llama", KEYS)
    with pytest.raises(ModelConfigError, match=r"llama\.gguf.*'llama'.*qwen35moe"):
        GGUFModel(path).config


def test_missing_key_names_file_and_key(tmp_path):
    keys = {k: v for k, v in KEYS.items() if k != "ssm.state_size"}
    with pytest.raises(ModelConfigError, match=r"m\.gguf.*qwen35moe\.ssm\.state_size"):
        GGUFModel(write_gguf(tmp_path / "m.gguf", "qwen35moe", keys)).config


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(ModelConfigError, match="bad.gguf"):
        GGUFModel(bad)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        GGUFModel("/nowhere.gguf")


def test_tensors_are_memory_mapped_not_copied(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "qwen35moe", KEYS,
                      {"token_embd.weight": np.arange(128, dtype=np.float32).reshape(8, 16)})
    model = GGUFModel(path)
    t = model.tensor("token_embd.weight")
    assert np.shares_memory(t.raw, model.file.data)
    assert t.shape == (8, 16)
    np.testing.assert_array_equal(t.dequant(), np.arange(128, dtype=np.float32).reshape(8, 16))
    np.testing.assert_array_equal(t.dequant([2]), np.arange(32, 48, dtype=np.float32)[None])


def test_truncated_file_is_a_clear_error(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "qwen35moe", KEYS,
                      {"token_embd.weight": np.ones((64, 64), np.float32)})
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ModelConfigError, match="truncated"):
        GGUFModel(path)


def test_metadata_matches_gguf_packages_reader(tmp_path):
    from gguf import GGUFReader
    path = write_gguf(tmp_path / "m.gguf", "qwen35moe", KEYS)
    ours, theirs = GGUFModel(path), GGUFReader(path)
    assert set(ours.keys()) == set(theirs.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key in ours.keys():
        assert ours.get(key) == pytest.approx(theirs.fields[key].contents())


def test_the_fingerprint_names_the_weights_not_the_path(tmp_path):
    """Two files of one shape with other weights differ; a copy of a file does not: the
    router's snapshot tier keeps one folder per fingerprint."""
    a, b = write_tiny_gguf(tmp_path / "a.gguf", seed=0), write_tiny_gguf(tmp_path / "b.gguf", seed=1)
    shutil.copy(a, tmp_path / "copy.gguf")
    fa, fb, fc = (GGUFModel(p).fingerprint for p in (a, b, tmp_path / "copy.gguf"))
    assert fa == fc and fa != fb
    model = GGUFModel(a)
    build_snapshot_cache(model.config, RouterMetrics(), 1 << 20, str(tmp_path / "snaps"), 64, fa)
    assert (tmp_path / "snaps" / f"{fa}-kv-f32").is_dir()          # and one per KV cache type
