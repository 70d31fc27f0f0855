"""The snapshot store: longest-prefix lookup at any position, shared KV, LRU budget, disk tier."""
from __future__ import annotations

import copy
import fcntl
import os
import random

import msgpack
import numpy as np
import pytest

from common.model.config import ModelConfig
from common.snapshots import SnapshotStore, disk
from common.state import SequenceState
from tests.snapshot_damage import DAMAGES, HEADER_DAMAGES, parts, rewrite

CFG = ModelConfig(arch="qwen35moe", vocab_size=50, hidden_size=8, n_layers=4, n_nextn_layers=0,
                  context_length=1024, rms_eps=1e-6, n_heads=2, n_kv_heads=1, head_dim=4, rope_dim=2,
                  rope_theta=1e4, full_attention_interval=4, conv_kernel=4, n_k_heads=1, n_v_heads=2,
                  head_k_dim=4, head_v_dim=4, v_head_layout="tiled", n_experts=2, n_experts_used=1,
                  expert_ffn=4, shared_ffn=4)
BLOCK = 8


def state_after(tokens) -> SequenceState:
    """A deterministic stand-in for the state a model would reach after `tokens`."""
    s = SequenceState.empty(CFG)
    s.pos = len(tokens)
    seed = int(np.sum(np.asarray(tokens) * np.arange(1, len(tokens) + 1))) % (2 ** 31)
    rng = np.random.default_rng(seed)
    s.conv = [rng.standard_normal(a.shape).astype(np.float32) for a in s.conv]
    s.ssm = [rng.standard_normal(a.shape).astype(np.float32) for a in s.ssm]
    # KV of position i depends only on the prefix up to i, as in a causal model
    kv = np.array([[[t * 1.0 + i] * 4] for i, t in enumerate(tokens)], np.float32)   # [pos, 1, 4]
    s.k, s.v = [kv.copy()], [-kv.copy()]
    return s


def put(store, tokens):
    """Put, and wait for its disk write (a thread's): the tests then read the files."""
    store.put(tokens, state_after(tokens), np.full(CFG.vocab_size, len(tokens), np.float32))
    assert store.flush(10)


def assert_same(a: SequenceState, b: SequenceState):
    assert a.pos == b.pos
    for x, y in zip(a.arrays(), b.arrays()):
        np.testing.assert_array_equal(x, y)


@pytest.fixture
def store():
    return SnapshotStore(CFG, budget_bytes=1 << 30, block=BLOCK)


def test_miss_on_empty_store(store):
    assert store.lookup([1, 2, 3]) is None
    assert (store.stats.lookups, store.stats.misses) == (1, 1)


@pytest.mark.parametrize("length", [1, 5, 8, 13, 16, 21])
def test_hit_at_any_length_returns_the_exact_state(store, length):
    tokens = list(range(1, 30))
    put(store, tokens[:length])
    state, logits = store.lookup(tokens)
    assert_same(state, state_after(tokens[:length]))
    assert logits[0] == length and store.stats.tokens_saved == length


def test_longest_prefix_wins_and_divergent_prefixes_miss(store):
    tokens = list(range(1, 40))
    for n in (3, 9, 17, 30):
        put(store, tokens[:n])
    assert store.lookup(tokens)[0].pos == 30
    assert store.lookup(tokens[:20])[0].pos == 17
    other = tokens[:10] + [99] + tokens[11:]
    assert store.lookup(other)[0].pos == 9
    assert store.lookup([7, 7, 7]) is None


def test_kv_blocks_are_shared_not_copied(store):
    tokens = list(range(1, 40))
    put(store, tokens[:20])
    put(store, tokens[:30])
    assert len(store.kv_blocks) == 3              # blocks 0-7, 8-15, 16-23; the tails stay in the snapshots
    assert store.refs[next(iter(store.kv_blocks))] == 2


def test_lru_budget_evicts_oldest(store):
    one = state_after(list(range(1, 17))).nbytes
    small = SnapshotStore(CFG, budget_bytes=int(2.5 * one), block=BLOCK)
    for start in (100, 200, 300):
        put(small, list(range(start, start + 16)))
    assert small.stats.evictions >= 1
    assert small.lookup(list(range(100, 116))) is None
    assert small.lookup(list(range(300, 316))) is not None
    assert small.ram_bytes <= small.budget


def test_disk_tier_survives_a_restart(tmp_path):
    tokens = list(range(1, 30))
    first = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    put(first, tokens[:21])
    again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    state, _ = again.lookup(tokens)
    assert_same(state, state_after(tokens[:21]))
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_damaged_disk_snapshot_is_refused_removed_and_written_anew(tmp_path, name):
    tokens = list(range(1, 30))
    put(SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path), tokens[:12])
    (path,) = tmp_path.glob("*.snap")
    DAMAGES[name](path)
    again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    if name in HEADER_DAMAGES:                     # refused at indexing, before any lookup
        assert again.stats.disk_rejected == 1 and not again.snaps and not path.exists()
    assert again.lookup(tokens) is None
    assert again.stats.disk_rejected == 1 and not path.exists()
    put(again, tokens[:12])
    state, _ = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path).lookup(tokens)
    assert_same(state, state_after(tokens[:12]))


def _nodes(tree, out):
    """(container, key) of every value inside a msgpack tree."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        out.append((tree, k))
        _nodes(v, out)
    return out


ODD_VALUES = [None, -1, 0, 1, 2**63 - 1, 2**64 - 1, -2**63, 1.5, float("nan"), "", "zz", "<f4", "|O", b"\0",
              [], {}, [[]], {"a": 1}, True, [1, 2], ["<f4", [1]], "0" * 32, ["0" * 32]]


def test_a_header_that_checks_out_but_says_anything_is_refused_or_used_whole(tmp_path):
    """Seeded: each of 400 headers has one value swapped for an odd one, or a byte changed, and
    its checksum made good; the store neither raises nor hands out anything but the true state."""
    rng = random.Random(0)
    tokens = list(range(1, 30))
    put(SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path), tokens[:12])
    (path,) = tmp_path.glob("*.snap")
    good = path.read_bytes()
    header, payload = parts(path)
    for _ in range(400):
        path.write_bytes(good)
        if rng.random() < 0.8:
            h = copy.deepcopy(header)
            tree, key = rng.choice(_nodes(h, []))
            tree[key] = copy.deepcopy(rng.choice(ODD_VALUES))
            rewrite(path, h, payload, signed=True)
        else:
            raw = bytearray(msgpack.packb(header))
            raw[rng.randrange(len(raw))] = rng.randrange(256)
            rewrite(path, None, payload, signed=True, raw=bytes(raw))
        found = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path).lookup(tokens)
        if found is not None:
            assert_same(found[0], state_after(tokens[:12]))
        else:
            assert not path.exists()


def test_a_file_that_checks_out_but_does_not_fit_the_state_is_a_miss(tmp_path, monkeypatch):
    tokens = list(range(1, 30))
    put(SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path), tokens[:12])

    def refuse(*args):
        raise ValueError("conv 0: shape (4, 3), expected (8, 3)")
    monkeypatch.setattr(SequenceState, "from_arrays", staticmethod(refuse))
    again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    assert again.lookup(tokens) is None
    assert again.stats.disk_rejected == 1 and not list(tmp_path.glob("*.snap"))


def test_orphaned_temporary_files_are_removed_at_start_but_not_a_live_writers(tmp_path):
    put(SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path), list(range(1, 13)))
    dead, live = tmp_path / f"{'a' * 32}.tmp999999", tmp_path / f"{'b' * 32}.tmp1"
    dead.write_bytes(b"partial")
    live.write_bytes(b"partial")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)                # as write_atomic holds it while it writes
    try:
        again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
        assert not dead.exists() and live.exists() and len(again.snaps) == 1
    finally:
        os.close(fd)
    SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    assert not live.exists()


def test_a_failed_disk_write_keeps_the_snapshot_in_ram(tmp_path, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(disk, "write_atomic", full)
    store = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path)
    tokens = list(range(1, 30))
    put(store, tokens[:12])
    assert_same(store.lookup(tokens)[0], state_after(tokens[:12]))


def test_evicted_from_ram_reloads_from_disk(tmp_path):
    one = state_after(list(range(1, 17))).nbytes
    store = SnapshotStore(CFG, budget_bytes=int(1.5 * one), block=BLOCK, disk_dir=tmp_path)
    put(store, list(range(100, 116)))
    put(store, list(range(200, 216)))
    state, _ = store.lookup(list(range(100, 120)))
    assert_same(state, state_after(list(range(100, 116))))
