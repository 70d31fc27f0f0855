"""The streaming plan of a dense model (qwen35) at real widths: which layers keep their FFN on the
GPU, what streams, and that the whole plan stays within the budget. Plain Python, no device."""
from __future__ import annotations

import pytest

from common.model.config import ModelConfig
from common.model.layers import GLOBALS, layer_specs
from native.cuda.plan import FFN_REGIONS, VramBudgetError, make_plan

# Qwen3.5-27B's text model, as its config.json gives it
QWEN35_27B = ModelConfig(
    arch="qwen35", vocab_size=248320, hidden_size=5120, n_layers=64, n_nextn_layers=0, context_length=262144,
    rms_eps=1e-6, n_heads=24, n_kv_heads=4, head_dim=256, rope_dim=64, rope_theta=1e7, full_attention_interval=4,
    conv_kernel=4, n_k_heads=16, n_v_heads=48, head_k_dim=128, head_v_dim=128, v_head_layout="tiled",
    n_experts=0, n_experts_used=0, expert_ffn=0, shared_ffn=0, ffn_kind="dense", dense_ffn=17408)
Q4_K_BYTES = 144 / 256          # bytes per weight of a Q4_K matrix


def file_sizes(cfg: ModelConfig) -> dict[str, int]:
    """Every tensor's bytes as a Q4_K file holds it (vectors in f32), by the layer specification."""
    def nbytes(spec) -> int:
        shape = spec.shape(cfg)
        n = 1
        for d in shape:
            n *= d
        return 4 * n if spec.vector else int(n * Q4_K_BYTES)
    sizes = {s.suffix: nbytes(s) for s in GLOBALS}
    for i in range(cfg.n_layers):
        sizes |= {f"blk.{i}.{s.suffix}": nbytes(s) for s in layer_specs(cfg, i)}
    return sizes


def test_an_8gib_budget_pins_a_prefix_of_layers_and_streams_the_rest():
    # the mixers' weights (3.8 GiB in Q4_K) stay resident: with the activations and the state they
    # leave no room at 6 GiB for 4,096-token passes and 8,192 tokens of context
    sizes = file_sizes(QWEN35_27B)
    ffn = sum(sizes[f"blk.0.ffn_{t}.weight"] for t in ("gate", "up", "down"))
    with pytest.raises(VramBudgetError, match="too small"):
        make_plan(QWEN35_27B, sizes, budget=6 << 30, pass_tokens=4096, max_context=8192)
    plan = make_plan(QWEN35_27B, sizes, budget=8 << 30, pass_tokens=4096, max_context=8192)
    assert plan.total_bytes <= plan.budget
    assert 0 < plan.ffn_layers < QWEN35_27B.n_layers and plan.regions == FFN_REGIONS
    assert plan.region_bytes >= ffn and plan.pinned_bytes >= plan.ffn_layers * ffn
    assert plan.streamed_bytes_per_pass >= (QWEN35_27B.n_layers - plan.ffn_layers) * ffn
    assert plan.n_experts == 0 and plan.least_slot_bytes == plan.ffn_bytes
    # more memory keeps more layers' FFNs, never fewer
    bigger = make_plan(QWEN35_27B, sizes, budget=12 << 30, pass_tokens=4096, max_context=8192)
    assert bigger.ffn_layers > plan.ffn_layers and bigger.total_bytes <= bigger.budget


def test_a_budget_that_holds_every_ffn_streams_nothing():
    sizes = file_sizes(QWEN35_27B)
    plan = make_plan(QWEN35_27B, sizes, budget=40 << 30, pass_tokens=512, max_context=4096)
    assert plan.ffn_layers == QWEN35_27B.n_layers and plan.head_resident
    assert plan.slot_bytes == 0 and plan.streamed_bytes_per_pass == 0


def test_a_budget_without_room_for_one_ffn_is_refused_with_the_sizes():
    sizes = file_sizes(QWEN35_27B)
    with pytest.raises(VramBudgetError, match="slot for one layer's FFN"):
        make_plan(QWEN35_27B, sizes, budget=1 << 30, pass_tokens=512, max_context=1024)


def test_every_budget_keeps_its_total_and_a_region_that_holds_what_streams():
    """From the least budget that runs to one that holds everything: the plan fits, a region holds
    a whole layer's FFN whenever anything streams, and more memory never streams more bytes (it may
    keep fewer layers' FFNs, where it keeps the LM head instead)."""
    sizes = file_sizes(QWEN35_27B)
    least = make_plan(QWEN35_27B, sizes, budget=1 << 40, pass_tokens=512, max_context=1024)
    fixed = least.dense_bytes + least.workspace_bytes + least.state_bytes + least.reserve_bytes
    top = fixed + least.pinned_bytes + least.head_bytes
    streamed = None
    for budget in range(fixed + least.ffn_bytes, top + (1 << 28), 1 << 28):
        plan = make_plan(QWEN35_27B, sizes, budget=budget, pass_tokens=512, max_context=1024)
        assert plan.total_bytes <= budget
        if plan.ffn_layers < QWEN35_27B.n_layers or not plan.head_resident:
            assert plan.region_bytes >= plan.ffn_bytes
        assert streamed is None or plan.streamed_bytes_per_pass <= streamed
        streamed = plan.streamed_bytes_per_pass
    assert plan.ffn_layers == QWEN35_27B.n_layers and plan.head_resident and streamed == 0
