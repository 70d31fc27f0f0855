"""--kv-type in serving: the reference model's cache in f16 and q8_0 against f32 on the demo
model, snapshots that keep KV in the cache's type (in RAM and on disk, one folder per type),
the router's refusal of a state of another type, and the option on the command line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from common.engines import load_runner
from common.kv_cache import DEFAULT_KV_TYPE, KvTypeError, check_kv_type, kv_decode, kv_encode
from common.metrics import RouterMetrics
from common.model.config import ModelConfig
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.model import ReferenceModel
from common.sequence_memory import sequence_memory
from common.snapshots import SnapshotStore
from common.state import SequenceState
from fermium.options import command, config, options
from services.decode.config import DecodeConfig
from services.prefill.config import PrefillConfig
from services.router.config import RouterConfig
from services.router.engine.prefix_cache import build_snapshot_cache, model_folder
from tests.conftest import fermium_cli

HELD_OUT = Path(__file__).resolve().parents[1] / "models" / "heldout_sample.txt"
GREEDY_TOKENS = 256
PROMPT_TOKENS = 384
# f16 keeps 11 significant bits of each K/V value: the demo model's logits (up to about 15)
# move in their third decimal
F16_LOGIT_ATOL = 2e-2
# q8_0 rounds each K/V value by up to half its block's step (max|x| / 254); through attention
# that moves the demo model's logits by a few tenths at most, where a broken conversion (a wrong
# scale, blocks out of order) moves them by whole units
Q8_0_LOGIT_ATOL = 0.3

# a store-sized model whose head size q8_0 can hold (32), with one full-attention layer of four
CFG = ModelConfig(arch="qwen35moe", vocab_size=50, hidden_size=8, n_layers=4, n_nextn_layers=0,
                  context_length=1024, rms_eps=1e-6, n_heads=2, n_kv_heads=2, head_dim=32, rope_dim=8,
                  rope_theta=1e4, full_attention_interval=4, conv_kernel=4, n_k_heads=1, n_v_heads=2,
                  head_k_dim=4, head_v_dim=4, v_head_layout="tiled", n_experts=2, n_experts_used=1,
                  expert_ffn=4, shared_ffn=4)
BLOCK = 8


# ---- the reference model on the demo model ---------------------------------------------------

@pytest.fixture(scope="module")
def demo() -> GGUFModel:
    return GGUFModel(default_model_path())


@pytest.fixture(scope="module")
def prompt(demo) -> list[int]:
    ids = Tokenizer.from_gguf(demo).encode(HELD_OUT.read_text(encoding="utf-8"))[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS
    return ids


@pytest.fixture(scope="module")
def prompt_logits(demo, prompt) -> dict:
    """Per KV type: (logits of every prompt token, the state after the prompt)."""
    out = {}
    for kv_type in ("f32", "f16", "q8_0"):
        ref = ReferenceModel(demo, kv_type=kv_type)
        state = ref.new_state()
        out[kv_type] = ref.prefill(prompt, state, all_logits=True), state
    return out


@pytest.mark.parametrize("kv_type, atol, dtype, width", [("f16", F16_LOGIT_ATOL, np.float16, 1.0),
                                                         ("q8_0", Q8_0_LOGIT_ATOL, np.uint8, 34 / 32)])
def test_the_reference_keeps_its_cache_in_the_type_and_stays_close_to_f32(demo, prompt_logits, kv_type, atol,
                                                                          dtype, width):
    cfg = demo.config
    want, f32_state = prompt_logits["f32"]
    got, state = prompt_logits[kv_type]
    assert state.kv_type == kv_type and state.pos == PROMPT_TOKENS
    for a, ref in zip(state.k + state.v, f32_state.k + f32_state.v):
        assert a.dtype == dtype and a.shape == (PROMPT_TOKENS, cfg.n_kv_heads, int(cfg.head_dim * width))
        # each row is the f32 row as the type stores it: the cache holds what attention read
        np.testing.assert_array_equal(a, kv_encode(ref, kv_type))
    assert state.nbytes == sequence_memory(cfg, PROMPT_TOKENS, kv_type).total_bytes
    diff = np.abs(got - want).max()
    assert 0 < diff < atol, diff                   # 0 would mean the cache type was never applied
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.99


def test_a_state_of_another_type_is_refused_by_the_reference(demo):
    with pytest.raises(ValueError, match="in 'f32', this runner in 'f16'"):
        ReferenceModel(demo, kv_type="f16").prefill([1, 2], SequenceState.empty(demo.config, "f32"))


def greedy_with_gaps(engine, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens, and at each step the gap between the two best logits."""
    state = engine.new_state()
    row = engine.prefill(ids, state).reshape(-1)
    tokens, gaps = [], []
    for _ in range(steps):
        top2 = np.sort(row)[-2:]
        tokens.append(int(np.argmax(row)))
        gaps.append(float(top2[1] - top2[0]))
        row = engine.decode([tokens[-1]], [state]).reshape(-1)
    return tokens, gaps


@pytest.mark.parametrize("runner", ["reference", "native"])
def test_f16_greedy_tokens_are_those_of_f32(demo, runner):
    """The demo model's 256 greedy tokens, each runner against itself: the same, or the same up
    to a step where f32's two best logits are closer than f16's cache can move them."""
    ids = Tokenizer.from_gguf(demo).encode("ROMEO:")
    runs = {}
    for kv_type in ("f32", "f16"):
        name, engine = load_runner(runner, demo, kv_type=kv_type)
        assert name == runner and engine.new_state().kv_type == kv_type
        runs[kv_type] = greedy_with_gaps(engine, ids, GREEDY_TOKENS)
    (want, gaps), (got, _) = runs["f32"], runs["f16"]
    assert len(want) == GREEDY_TOKENS and got[:8] == want[:8]
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None or gaps[first] < 2 * F16_LOGIT_ATOL, (first, gaps[first])


# ---- snapshots in the cache's type -----------------------------------------------------------

def state_after(tokens, kv_type: str) -> SequenceState:
    """A deterministic stand-in for a model's state after `tokens`, KV stored in `kv_type`."""
    s = SequenceState.empty(CFG, kv_type)
    s.pos = len(tokens)
    rng = np.random.default_rng(int(np.sum(tokens)) % 2 ** 31)
    s.conv = [rng.standard_normal(a.shape).astype(np.float32) for a in s.conv]
    s.ssm = [rng.standard_normal(a.shape).astype(np.float32) for a in s.ssm]
    kv = np.array([[[t + i / 7 + j for j in range(CFG.head_dim)]] * CFG.n_kv_heads for i, t in enumerate(tokens)],
                  np.float32)   # [pos, n_kv, head_dim]: row i depends on the prefix up to i only
    s.k, s.v = [kv_encode(kv, kv_type)], [kv_encode(-kv, kv_type)]
    return s


def put(store, tokens, kv_type):
    store.put(tokens, state_after(tokens, kv_type), np.full(CFG.vocab_size, len(tokens), np.float32))
    assert store.flush(10)                       # the disk writer's thread


def assert_same(a: SequenceState, b: SequenceState):
    assert (a.pos, a.kv_type) == (b.pos, b.kv_type)
    for x, y in zip(a.arrays(), b.arrays()):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_snapshots_round_trip_in_ram_and_on_disk(tmp_path, kv_type):
    tokens = list(range(1, 30))
    first = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, kv_type=kv_type)
    for n in (5, 21):
        put(first, tokens[:n], kv_type)
    state, logits = first.lookup(tokens)
    assert_same(state, state_after(tokens[:21], kv_type))
    assert logits[0] == 21
    assert all(a.dtype == state.k[0].dtype for ks, vs in first.kv_blocks.values() for a in (*ks, *vs))
    again = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path, kv_type=kv_type)   # a restart
    assert len(again.snaps) == 2 and again.stats.disk_rejected == 0
    assert_same(again.lookup(tokens)[0], state_after(tokens[:21], kv_type))
    assert_same(again.lookup(tokens[:9])[0], state_after(tokens[:5], kv_type))
    with pytest.raises(ValueError, match="in 'f32', this snapshot store in"):
        again.put(tokens[:3], state_after(tokens[:3], "f32"), np.zeros(CFG.vocab_size, np.float32))


def test_f16_snapshots_take_half_the_kv_bytes_of_f32(tmp_path):
    tokens = list(range(1, 42))
    sizes = {}
    for kv_type in ("f32", "f16"):
        store = SnapshotStore(CFG, 1 << 30, block=BLOCK, disk_dir=tmp_path / kv_type, kv_type=kv_type)
        put(store, tokens, kv_type)
        kv = sum(a.nbytes for ks, vs in store.kv_blocks.values() for a in (*ks, *vs))
        kv += sum(a.nbytes for s in store.snaps.values() for a in (*s.tail_k, *s.tail_v))
        sizes[kv_type] = kv, store.ram_bytes, store.disk_bytes
    (kv32, ram32, disk32), (kv16, ram16, disk16) = sizes["f32"], sizes["f16"]
    assert kv16 * 2 == kv32 == 2 * 2 * len(tokens) * CFG.n_kv_heads * CFG.head_dim * 2
    assert ram32 - ram16 == kv16 and disk32 - disk16 == kv16     # the rest (recurrent state, logits) is f32


def test_a_restart_with_another_kv_type_sees_none_of_the_other_files(tmp_path, caplog):
    tokens = list(range(1, 30))
    cache = build_snapshot_cache(CFG, RouterMetrics(), 1 << 20, str(tmp_path), 0, "abc123", "f32")
    assert cache.store.disk_dir == model_folder(tmp_path, "abc123", "f32") == tmp_path / "abc123-kv-f32"
    f32 = state_after(tokens[:12], "f32")
    cache.store_state(tokens, 12, f32.arrays(), np.zeros(CFG.vocab_size, np.float32), "prefill", "f32")
    assert cache.store.flush(10)
    assert len(list(cache.store.disk_dir.glob("*.snap"))) == 1
    other = build_snapshot_cache(CFG, RouterMetrics(), 1 << 20, str(tmp_path), 0, "abc123", "f16")
    assert other.store.disk_dir == tmp_path / "abc123-kv-f16"
    assert other.store.stats.disk_rejected == 0 and other.lookup(tokens) == (0, None, None)
    # a state of another type is refused, logged, and not stored
    with caplog.at_level("ERROR", logger="fermium.router"):
        other.store_state(tokens, 12, f32.arrays(), np.zeros(CFG.vocab_size, np.float32), "decode", "f32")
    assert "from decode keeps its KV cache in 'f32', the router in 'f16'" in caplog.text
    assert other.lookup(tokens) == (0, None, None)
    # a state that says f16 but holds f32 arrays: refused naming the array
    other.store_state(tokens, 12, f32.arrays(), np.zeros(CFG.vocab_size, np.float32), "decode", "f16")
    assert "state k[0] is float32" in caplog.text and other.lookup(tokens) == (0, None, None)
    again = build_snapshot_cache(CFG, RouterMetrics(), 1 << 20, str(tmp_path), 0, "abc123", "f32")
    pos, arrays, _ = again.lookup(tokens)
    assert pos == 12 and arrays[-1].dtype == np.float32     # the f32 file was neither read nor removed


# ---- the option ------------------------------------------------------------------------------

def test_kv_type_names_are_checked():
    assert check_kv_type(DEFAULT_KV_TYPE) == "f16" and check_kv_type("q8_0") == "q8_0"
    with pytest.raises(KvTypeError, match="'bogus' is not one of f16, q8_0, f32"):
        check_kv_type("bogus")
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(1, 2, 32)
    np.testing.assert_allclose(kv_decode(kv_encode(x, "q8_0"), "q8_0"), x, atol=2 / 254)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_kv_encode_into_a_slice_gives_the_bytes_it_returns(kv_type):
    """The CUDA prefill encodes each pass's rows into the state's arrays in place."""
    x = np.random.default_rng(1).standard_normal((5, 2, 64)).astype(np.float32)
    x[0, 0, :3] = [1.0 + 2.0 ** -11, 65504.0, 1e-7]                 # an f16 tie, its largest, a subnormal
    cache = np.zeros((9, 2, kv_encode(x[:1], kv_type).shape[-1]), kv_encode(x[:1], kv_type).dtype)
    kv_encode(x, kv_type, out=cache[3:8])
    np.testing.assert_array_equal(cache[3:8], kv_encode(x, kv_type))
    assert not cache[:3].any() and not cache[8:].any()


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["decode"], ["up", "--port", "0"],
                                     ["bench", "decode", "--model", "README.md"]], ids=lambda c: c[0] + c[-1])
def test_a_bad_kv_type_is_one_line_naming_the_choices(command):
    proc = fermium_cli(*command, "--kv-type", "bogus", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --kv-type 'bogus' is not one of f16, q8_0, f32"]


@pytest.mark.parametrize("cls", [RouterConfig, PrefillConfig, DecodeConfig])
def test_the_option_of_every_service_and_its_env_var(cls):
    seen = {}

    @command(options(cls, "kv_type"))
    def show(**settings):
        seen.update(kv=config(cls, settings, model="m").kv_type)

    app = typer.Typer()
    app.command()(show)
    runner = CliRunner()
    assert runner.invoke(app, []).exit_code == 0 and seen["kv"] == DEFAULT_KV_TYPE == "f16"
    assert runner.invoke(app, ["--kv-type", "q8_0"]).exit_code == 0 and seen["kv"] == "q8_0"
    assert runner.invoke(app, [], env={"FERMIUM_KV_TYPE": "f32"}).exit_code == 0 and seen["kv"] == "f32"


def test_up_passes_the_kv_type_to_the_services_it_starts(monkeypatch):
    from tests.stack_helpers import up_stack_kwargs
    seen = up_stack_kwargs(monkeypatch, kv_type="q8_0", model=default_model_path())
    for role in ("router", "prefill", "decode"):
        flags = seen["extra"][role]
        assert flags[flags.index("--kv-type") + 1] == "q8_0", role
