"""The numpy reference dequantization (common/model/quants) against gguf's own `dequantize`, bit
for bit: random blocks, zero and largest scales, every byte value in every position (so every
4-bit and 2-bit code and every sign pattern), and every index of each i-quant grid."""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize

from common.model.config import ModelConfigError
from common.model.gguf_file import SUPPORTED_TYPES, GGUFModel
from common.model.quants import QUANTS, UnknownQuantError, dequantize
from common.model.quants.tables import GRIDS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

TYPES = sorted(QUANTS, key=lambda q: q.name)
ISSUE_TYPES = {T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
               T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_XXS, T.IQ3_S, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M,
               T.MXFP4, T.TQ1_0, T.TQ2_0}
F16_ONE, F16_MAX = 0x3C00, 0x7BFF

# where each type keeps its f16 scales (the super-block d, and dmin): byte offsets in a block
F16_SCALES = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.IQ4_NL: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_XS: (0,),
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ1_S: (0,),
    T.TQ1_0: (52,), T.TQ2_0: (64,),
}


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    want = np.asarray(want, np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} values differ, first at {np.argwhere(~same)[0]}"


def check(raw: np.ndarray, qtype: T) -> None:
    with np.errstate(all="ignore"):
        want = gguf_dequantize(raw, qtype)
    assert_same_bits(dequantize(raw, qtype), want)


def random_blocks(qtype: T, n: int, seed: int = 0) -> np.ndarray:
    nbytes = QUANTS[qtype].block_bytes
    return np.frombuffer(np.random.default_rng(seed).bytes(n * nbytes), np.uint8).reshape(n, nbytes).copy()


def set_scales(raw: np.ndarray, qtype: T, bits: int) -> np.ndarray:
    """Every f16 scale field of every block set to `bits` (MXFP4: its E8M0 byte; IQ1_M: the f16
    spread over the top nibbles of its four scale words)."""
    raw = raw.copy()
    if qtype == T.MXFP4:
        raw[:, 0] = bits
    elif qtype == T.IQ1_M:
        words = raw[:, 48:56].view(np.uint16)
        words &= 0x0FFF
        words |= ((bits >> np.array([0, 4, 8, 12], np.uint16)) & 0xF).astype(np.uint16) << 12
    else:
        for at in F16_SCALES.get(qtype, ()):
            raw[:, at:at + 2] = np.array([bits], np.uint16).view(np.uint8)
    return raw


def test_the_registry_holds_every_type_with_ggml_sizes():
    assert set(QUANTS) == ISSUE_TYPES and set(SUPPORTED_TYPES) == ISSUE_TYPES
    for q in QUANTS.values():
        assert (q.block, q.block_bytes) == GGML_QUANT_SIZES[q.qtype]
    assert QUANTS[T.Q4_K].bits_per_weight == 4.5 and QUANTS[T.IQ2_XXS].bits_per_weight == 2.0625


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_random_blocks(qtype):
    raw = random_blocks(qtype, 3 * 257).reshape(3, -1)          # rows of 257 blocks: a ragged chunk
    check(raw, qtype)


SCALED = sorted([*F16_SCALES, T.IQ1_M], key=lambda q: q.name)


@pytest.mark.parametrize("qtype", SCALED, ids=lambda q: q.name)
def test_zero_and_largest_scales(qtype):
    raw = random_blocks(qtype, 64, seed=1)
    for bits in (0x0000, 0x8000, F16_ONE, F16_MAX, 0xFBFF, 0x0001, 0x7C00, 0x7E00):   # zeros, max, inf, NaN
        check(set_scales(raw, qtype, bits), qtype)
    assert not np.any(dequantize(set_scales(raw, qtype, 0), qtype)), "a zero scale gives zeros"


def test_mxfp4_every_exponent():
    raw = random_blocks(T.MXFP4, 256, seed=1)
    raw[:, 0] = np.arange(256)                                  # 0 and 1: the subnormal branch
    check(raw, T.MXFP4)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda q: q.name)
def test_every_16_bit_float(qtype):
    check(np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(256, 512), qtype)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_every_byte_value_in_every_position(qtype):
    # block i, byte j = (i + j) mod 256: each 4-bit and 2-bit code, sign byte and sub-scale in
    # each place, under a unit scale
    nbytes = QUANTS[qtype].block_bytes
    raw = ((np.arange(256)[:, None] + np.arange(nbytes)[None, :]) % 256).astype(np.uint8)
    check(raw, qtype)
    if qtype in F16_SCALES or qtype == T.IQ1_M:
        check(set_scales(raw, qtype, F16_ONE), qtype)


# how an i-quant block names its grid entries: (grid, groups per block, write(raw, group, index))
def _byte(at: int):
    def put(raw, g, idx):
        raw[:, at + g] = idx
    return put


def _iq2_xxs(raw, g, idx):
    raw[:, 2 + 8 * (g // 4) + g % 4] = idx


def _iq2_xs(raw, g, idx):
    word = raw[:, 2 + 2 * g:4 + 2 * g].view(np.uint16)
    word[:] = (word & 0xFE00) | idx[:, None]


def _high_bits(qs_at: int, qh_at: int, bits: int):
    def put(raw, g, idx):
        raw[:, qs_at + g] = idx & 0xFF
        per = 8 // bits
        byte, shift = qh_at + g // per, bits * (g % per)
        raw[:, byte] = (raw[:, byte] & ~np.uint8(((1 << bits) - 1) << shift)) | ((idx >> 8) << shift).astype(np.uint8)
    return put


def _iq1_s(raw, g, idx):
    raw[:, 2 + g] = idx & 0xFF
    word = raw[:, 34 + 2 * (g // 4):36 + 2 * (g // 4)].view(np.uint16)
    shift = 3 * (g % 4)
    word[:] = (word & ~np.uint16(7 << shift)) | ((idx >> 8).astype(np.uint16) << shift)[:, None]


def _iq1_m(raw, g, idx):
    raw[:, g] = idx & 0xFF
    at, shift = 32 + g // 2, 4 * (g % 2)
    raw[:, at] = (raw[:, at] & ~np.uint8(7 << shift)) | ((idx >> 8) << shift).astype(np.uint8)


GRID_INDEX = {
    T.IQ2_XXS: ("iq2xxs_grid", 32, _iq2_xxs), T.IQ2_XS: ("iq2xs_grid", 32, _iq2_xs),
    T.IQ2_S: ("iq2s_grid", 32, _high_bits(2, 66, 2)), T.IQ3_XXS: ("iq3xxs_grid", 64, _byte(2)),
    T.IQ3_S: ("iq3s_grid", 64, _high_bits(2, 66, 1)), T.IQ1_S: ("iq1s_grid", 32, _iq1_s),
    T.IQ1_M: ("iq1s_grid", 32, _iq1_m),
}


@pytest.mark.parametrize("qtype", sorted(GRID_INDEX, key=lambda q: q.name), ids=lambda q: q.name)
def test_every_grid_index(qtype):
    grid, groups, put = GRID_INDEX[qtype]
    entries = len(GRIDS[grid])
    n = -(-entries // groups) * 2                               # each index twice, in two places
    raw = set_scales(random_blocks(qtype, n, seed=2), qtype, F16_ONE)
    for g in range(groups):
        put(raw, g, ((np.arange(n) * groups + g) * 7 % entries).astype(np.uint16))
    check(raw, qtype)
    # a value is the grid entry under a nonzero scale: the whole grid shows in the output
    got = np.abs(dequantize(raw, qtype).reshape(n, -1, GRIDS[grid].shape[1]))
    assert np.count_nonzero(got.max(axis=(0, 2))) == got.shape[1]


def test_tensor_dequant_selects_experts_and_keeps_shapes():
    raw = random_blocks(T.Q3_K, 4 * 3 * 2).reshape(4, 3, 2 * 110)    # (experts, out, row bytes)
    full = dequantize(raw, T.Q3_K)
    assert full.shape == (4, 3, 512)
    assert_same_bits(dequantize(raw[[2, 0]], T.Q3_K), full[[2, 0]])


def test_an_unknown_type_is_named(tmp_path):
    with pytest.raises(UnknownQuantError, match=r"Q8_1.*known:.*IQ2_XXS"):
        dequantize(np.zeros((1, 40), np.uint8), T.Q8_1)
    path = tmp_path / "q8_1.gguf"
    w = gguf.GGUFWriter(str(path), "qwen35moe")
    w.add_tensor("token_embd.weight", np.zeros((8, 40), np.uint8), raw_dtype=T.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelConfigError, match=r"q8_1\.gguf: tensor token_embd\.weight has type Q8_1; "
                                               r"supported: .*IQ1_M.*Q2_K.*TQ2_0"):
        GGUFModel(path)


@pytest.mark.parametrize("recipe", ["dynamic", "iq2_m", "iq1_m", "q3_k_m"])
def test_a_mixed_file_dequantizes_tensor_by_tensor_as_gguf_does(tmp_path, recipe):
    model = GGUFModel(write_synthetic(tmp_path / f"{recipe}.gguf", layers=4, recipe=recipe, widths=TINY))
    assert len({t.qtype for t in model.tensors.values()}) >= 4
    for t in model.tensors.values():
        assert_same_bits(t.dequant(), gguf_dequantize(np.ascontiguousarray(t.raw), t.qtype).reshape(t.shape))
        if len(t.shape) == 3:                                    # a few experts, as the reference routes
            assert_same_bits(t.dequant(np.array([3, 1])), t.dequant()[[3, 1]])
