"""Every native dot kernel against its generic sibling and a float reference, for every ISA
this CPU runs; plus the activation quantizers, row dequantizers, matvec driver and dispatch."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from native import cpu_lib
from native.cpu_lib import lib
from tests import kernel_calls
from tools.synthetic_blocks import MAKERS

# SIMD and generic do the same integer sums; only the float accumulation order differs.
SIBLING_RTOL = 1e-5
# Activation rounding moves each x_i by at most half its block step (amax / 127 / 2); the
# dot can move by at most sum |w_i| * that. Slack covers fp32 accumulation.
ROUNDING_SLACK = 1.001
FLOAT_ATOL = 1e-4
# Float-weight kernels take fp32 activations: only summation order differs from float64.
FLOAT_RTOL = 1e-5

IQ2_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S]
# the other blocks of 32 (q32_*.c): d (f16, MXFP4 an E8M0 exponent byte), the min of Q4_1 and Q5_1
Q32_TYPES = [T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.MXFP4]
LOWBIT_TYPES = [T.Q2_K, T.Q3_K, T.IQ4_XS, T.TQ2_0, T.TQ1_0]
# the 3- and 1-bit i-quants: every ISA sums the generic kernel's integers (iq_lowbit.h)
IQ_LOWBIT_TYPES = [T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
QUANT_TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, *IQ2_TYPES, *Q32_TYPES, *LOWBIT_TYPES, *IQ_LOWBIT_TYPES]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
ISAS = cpu_lib.supported_isas()
N = 1024


def f16(rng, n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_rows(qtype: T, rows: int, n: int, rng, scale: tuple[float, float] = (1e-3, 4e-3)) -> np.ndarray:
    """(rows, row_bytes) valid blocks: quantized floats, or random bytes with small scales."""
    if qtype in (T.Q4_0, T.Q8_0):
        std = 1.0 if scale[1] >= 1e-3 else scale[1]      # tiny values: subnormal f16 block scales
        return quantize((rng.standard_normal((rows, n)) * std).astype(np.float32), qtype)
    if qtype in FLOAT_TYPES:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        if qtype == T.F32:
            return x.view(np.uint8)
        if qtype == T.F16:
            return x.astype(np.float16).view(np.uint8)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * n // block, nbytes), dtype=np.uint8)
    if qtype == T.MXFP4:   # the exponent of a power of two in the range
        blocks[:, 0] = np.round(np.log2(rng.uniform(*scale, len(blocks)))).astype(np.uint8) + 128
    elif qtype in Q32_TYPES:
        blocks[:, 0:2] = f16(rng, len(blocks), *scale)   # d
        if qtype in (T.Q4_1, T.Q5_1):                     # the min, either sign
            blocks[:, 2:4] = f16(rng, len(blocks), -16 * scale[1], 16 * scale[1])
    elif qtype in IQ2_TYPES:                             # d first; any bytes after it are valid
        blocks[:, 0:2] = f16(rng, len(blocks), *scale)
    elif qtype in IQ_LOWBIT_TYPES:                       # d (IQ1_M's spread over its scale words)
        MAKERS[qtype].scale(blocks, rng.uniform(*scale, len(blocks)))
    else:
        lo, hi = F16_FIELDS[qtype]
        for at in range(lo, hi, 2):
            blocks[:, at:at + 2] = f16(rng, len(blocks), *scale)
    return blocks.reshape(rows, -1)


# the bytes of each super-block type's f16 scales (d, and dmin where there is one)
F16_FIELDS = {T.Q4_K: (0, 4), T.Q5_K: (0, 4), T.Q6_K: (208, 210), T.Q2_K: (80, 84), T.Q3_K: (108, 110),
              T.IQ4_XS: (0, 2), T.TQ2_0: (64, 66), T.TQ1_0: (52, 54)}


def act_values(qtype: T, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-element quantization step bound (amax/254) of x for qtype's activation blocks."""
    block = GGML_QUANT_SIZES[qtype][0]
    amax = np.abs(x.reshape(-1, block)).max(axis=1)
    return np.repeat(amax / 254.0, block)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quant_dot_matches_generic_and_float(isa, qtype, rng):
    w = random_rows(qtype, 8, N, rng)
    wf = dequantize(w, qtype).astype(np.float64)
    for r in range(w.shape[0]):
        x = (rng.standard_normal(N) * rng.uniform(0.1, 10)).astype(np.float32)
        act = kernel_calls.quantize_act(qtype, x)
        got = kernel_calls.vec_dot(isa, qtype, w[r], act, N)
        generic = kernel_calls.vec_dot("generic", qtype, w[r], act, N)
        magnitude = float(np.abs(wf[r] * x).sum())
        assert abs(got - generic) <= SIBLING_RTOL * magnitude, (isa, r, got, generic)
        ref = float(wf[r] @ x.astype(np.float64))
        bound = float(np.abs(wf[r]) @ act_values(qtype, x)) * ROUNDING_SLACK + FLOAT_ATOL
        assert abs(got - ref) <= bound, (isa, r, got, ref, bound)


# f16 subnormals start below 6.1e-5; real Q6_K files hold block scales around 1e-5
SUBNORMAL_SCALES = (1e-7, 5e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_subnormal_block_scales(isa, qtype, rng):
    w = random_rows(qtype, 8, N, rng, scale=SUBNORMAL_SCALES)
    wf = dequantize(w, qtype).astype(np.float64)
    x = rng.standard_normal(N).astype(np.float32)
    act = kernel_calls.quantize_act(qtype, x)
    for r in range(w.shape[0]):
        got = kernel_calls.vec_dot(isa, qtype, w[r], act, N)
        magnitude = float(np.abs(wf[r] * x).sum())
        assert magnitude > 0
        assert abs(got - kernel_calls.vec_dot("generic", qtype, w[r], act, N)) <= SIBLING_RTOL * magnitude
        bound = float(np.abs(wf[r]) @ act_values(qtype, x)) * ROUNDING_SLACK + FLOAT_ATOL * magnitude
        assert abs(got - float(wf[r] @ x)) <= bound


def extreme_quants(qtype: T, byte: int = 0xFF) -> np.ndarray:
    """One row (1, row_bytes) of N values, every quant byte `byte` (0xFF: each quant at its
    largest; 0: at its smallest, the most negative for the offset and code-book types Q4_0,
    Q5_0, Q6_K, Q3_K, IQ4_NL, IQ4_XS and the ternary ones; MXFP4's code book takes 0x77 and 0xFF
    for them), block scales 1, sub-block scales at their largest magnitude (Q6_K's 127, Q3_K's and
    IQ4_XS's -32), mins 0."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    if qtype == T.MXFP4:
        byte = {0xFF: 0x77, 0x00: 0xFF}[byte]   # codes 7 (+12) and 15 (-12)
    blocks = np.full((N // block, nbytes), byte, np.uint8)
    one = np.array([1.0], np.float16).view(np.uint8)
    if qtype == T.MXFP4:
        blocks[:, 0] = 128                            # 2^(128 - 128) times the doubled E2M1 values
    elif qtype in LOWBIT_TYPES:
        blocks[:, F16_FIELDS[qtype][0]:F16_FIELDS[qtype][1]] = 0   # dmin 0 (Q2_K)
        blocks[:, F16_FIELDS[qtype][0]:F16_FIELDS[qtype][0] + 2] = one
        sub_scales = {T.Q2_K: (slice(0, 16), 0x0F), T.Q3_K: (slice(96, 108), 0), T.IQ4_XS: (slice(2, 8), 0)}
        if qtype in sub_scales:
            at, value = sub_scales[qtype]
            blocks[:, at] = value
    elif qtype == T.Q6_K:
        blocks[:, 192:208] = 127                      # int8 sub-block scales
        blocks[:, 208:210] = one
    elif qtype in IQ_LOWBIT_TYPES:                    # 0xFF: the largest sub-block scales, every sign
        MAKERS[qtype].scale(blocks, np.ones(len(blocks)))
    else:
        blocks[:, 0:2] = one
        if qtype in (T.Q4_K, T.Q5_K):
            blocks[:, 2:4] = 0                        # dmin 0: only the scaled quants count
            blocks[:, 4:16] = 0xFF                    # sub-block scales 63
        if qtype in (T.Q4_1, T.Q5_1):
            blocks[:, 2:4] = 0                        # min 0
    return blocks.reshape(1, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("byte", [0xFF, 0x00], ids=["largest", "smallest"])
def test_extreme_quants_and_activations_stay_exact(isa, qtype, sign, byte):
    """Every quant at its largest or smallest value against activations all at +-127: the widest
    int16 sums the SIMD kernels form (pmaddubsw pairs and their reductions, with the offset
    corrections) must not saturate."""
    w = extreme_quants(qtype, byte)
    x = np.full(N, sign, np.float32)
    act = kernel_calls.quantize_act(qtype, x)
    ref = float(dequantize(w, qtype).astype(np.float64)[0] @ x)
    got = kernel_calls.vec_dot(isa, qtype, w[0], act, N)
    assert abs(got - kernel_calls.vec_dot("generic", qtype, w[0], act, N)) <= SIBLING_RTOL * abs(ref)
    assert abs(got - ref) <= SIBLING_RTOL * abs(ref)


IQ2_EDGE_N = 8192   # 1024 grid entries of 8 values: each index of IQ2_S once, of the others more


def iq2_edge_row(qtype: T, d: float = 1.0) -> np.ndarray:
    """One row (1, row_bytes) of IQ2_EDGE_N values holding every grid index and every sign
    pattern of qtype, with 4-bit scales 0 and 15 (both halves of a sub-block, and each alone
    where they are per 16 values), block scales d."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    nb, e = IQ2_EDGE_N // block, np.arange(IQ2_EDGE_N // 8)
    sub = np.arange(IQ2_EDGE_N // 32)
    nibbles = np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8)[sub % 4]       # per sub-block
    if qtype == T.IQ2_XXS:   # per sub-block: 4 index bytes, 4 x 7 sign bits and the scale
        signs = (e % 128).reshape(-1, 4).astype(np.uint32) << np.array([0, 7, 14, 21], np.uint32)
        words = signs.sum(axis=1, dtype=np.uint32) | (nibbles.astype(np.uint32) & 15) << 28
        qs = np.concatenate([(e % 256).astype(np.uint8).reshape(-1, 4), words.view(np.uint8).reshape(-1, 4)], axis=1)
        body = qs.reshape(nb, -1)
    elif qtype == T.IQ2_XS:
        qs = ((e % 512) | (e % 128) << 9).astype(np.uint16).view(np.uint8)
        body = np.concatenate([qs.reshape(nb, -1), nibbles.reshape(nb, -1)], axis=1)
    else:
        idx = e % 1024
        qh = ((idx >> 8).reshape(-1, 4) << np.array([0, 2, 4, 6])).sum(axis=1).astype(np.uint8)
        body = np.concatenate([(idx & 255).astype(np.uint8).reshape(nb, -1), (e % 256).astype(np.uint8).reshape(nb, -1),
                               qh.reshape(nb, -1), nibbles.reshape(nb, -1)], axis=1)
    scale = np.repeat(np.array([[d]], np.float16).view(np.uint8), nb, axis=0)
    return np.concatenate([scale, body], axis=1).reshape(1, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", IQ2_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("d", [1.0, 65504.0], ids=["d1", "dmax"])
def test_iq2_every_grid_index_sign_pattern_and_scale(isa, qtype, d, rng):
    """Every grid entry and sign pattern, zero and largest scales (4-bit and, with d the largest
    f16, block): the row dequantizer gives gguf's floats, and each ISA's dot gives the generic one
    and the float dot within the bounds, for random activations and all at +-127 (the widest
    `pmaddubsw` sums)."""
    w = iq2_edge_row(qtype, d)
    wf = dequantize(w, qtype).astype(np.float64)[0]
    assert len(w[0]) == IQ2_EDGE_N // 256 * GGML_QUANT_SIZES[qtype][1] and np.abs(wf).max() == d * 31 / 8 * 0x2b
    out = np.empty(IQ2_EDGE_N, np.float32)
    lib.fm_dequant_row(int(qtype), cpu_lib.ptr(np.ascontiguousarray(w[0])), cpu_lib.ptr(out, "float *"), IQ2_EDGE_N)
    np.testing.assert_array_equal(out, wf.astype(np.float32))
    for x in (rng.standard_normal(IQ2_EDGE_N).astype(np.float32), np.ones(IQ2_EDGE_N, np.float32),
              -np.ones(IQ2_EDGE_N, np.float32)):
        act = kernel_calls.quantize_act(qtype, x)
        got = kernel_calls.vec_dot(isa, qtype, w[0], act, IQ2_EDGE_N)
        magnitude = float(np.abs(wf * x).sum())
        assert abs(got - kernel_calls.vec_dot("generic", qtype, w[0], act, IQ2_EDGE_N)) <= SIBLING_RTOL * magnitude
        bound = float(np.abs(wf) @ act_values(qtype, x)) * ROUNDING_SLACK + SIBLING_RTOL * magnitude
        assert abs(got - float(wf @ x)) <= bound, (got, float(wf @ x), bound)


@pytest.mark.parametrize("isa", ISAS)
def test_subnormal_block_scales_in_the_pools_float_mode(isa, rng):
    """Pool jobs run with flush-to-zero (internal.h); a subnormal f16 scale must still count."""
    with kernel_calls.isa_restored(isa):
        pool = cpu_lib.Pool(2)
        for qtype in QUANT_TYPES:
            w = random_rows(qtype, 16, N, rng, scale=SUBNORMAL_SCALES)
            x = rng.standard_normal((1, N)).astype(np.float32)
            got = kernel_calls.matvec(pool, qtype, w, x)[0]
            act = kernel_calls.quantize_act(qtype, x[0])
            expect = np.array([kernel_calls.vec_dot(isa, qtype, w[r], act, N) for r in range(16)], np.float32)
            scale = np.abs(dequantize(w, qtype)) @ np.abs(x[0])
            assert np.all(scale > 0)
            assert np.all(np.abs(got - expect) <= SIBLING_RTOL * scale), qtype.name


# the bytes of each lower-bit type's quants, and its sub-block scales: packed to all zero, and
# to the largest magnitude (Q2_K: scale 15 and min 15; Q3_K and IQ4_XS: -32); the ternary
# types have only d
LOWBIT_QUANTS = {T.Q2_K: slice(16, 80), T.Q3_K: slice(0, 96), T.IQ4_XS: slice(8, 136), T.TQ2_0: slice(0, 64),
                 T.TQ1_0: slice(0, 52)}
LOWBIT_SCALES = {T.Q2_K: (slice(0, 16), [0x00], [0xFF]), T.Q3_K: (slice(96, 108), [0] * 8 + [0xAA] * 4, [0]),
                 T.IQ4_XS: (slice(2, 8), [0xAA, 0xAA, 0, 0, 0, 0], [0]), T.TQ2_0: (slice(64, 66), [0], None),
                 T.TQ1_0: (slice(52, 54), [0], None)}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", LOWBIT_TYPES, ids=lambda t: t.name)
def test_lowbit_every_code_and_the_extreme_scales(isa, qtype, rng):
    """Quant bytes through every value 0..255 (every 2-bit field, Q3_K's high bits, both IQ4_XS
    nibbles, every TQ1_0 byte), in blocks whose scales are all zero, at their largest magnitude,
    and random: the row dequantizer equals gguf's, every dot the generic one and the float one."""
    w = random_rows(qtype, 4, N, rng).reshape(-1, GGML_QUANT_SIZES[qtype][1])   # (16 blocks, block bytes)
    quants = w[:, LOWBIT_QUANTS[qtype]]
    w[:, LOWBIT_QUANTS[qtype]] = (np.arange(quants.size) % 256).astype(np.uint8).reshape(quants.shape)
    at, zero, largest = LOWBIT_SCALES[qtype]
    w[0::4, at] = zero
    if largest is not None:
        w[1::4, at] = largest
    w = w.reshape(4, -1)
    wf = dequantize(w, qtype).astype(np.float64)
    assert np.all(wf[:, :256] == 0) and np.any(wf[:, 256:512] != 0)
    out = np.empty(N, np.float32)
    for r in range(4):
        row = np.ascontiguousarray(w[r])
        cpu_lib.lib.fm_dequant_row(int(qtype), cpu_lib.ptr(row), cpu_lib.ptr(out, "float *"), N)
        np.testing.assert_array_equal(out, wf[r].astype(np.float32))
        for x in rng.standard_normal(N).astype(np.float32), np.full(N, -1.0, np.float32):
            act = kernel_calls.quantize_act(qtype, x)
            got, generic = (kernel_calls.vec_dot(i, qtype, w[r], act, N) for i in (isa, "generic"))
            magnitude = float(np.abs(wf[r] * x).sum())
            assert abs(got - generic) <= SIBLING_RTOL * magnitude, (isa, r, got, generic)
            bound = float(np.abs(wf[r]) @ act_values(qtype, x)) * ROUNDING_SLACK + FLOAT_ATOL
            assert abs(got - float(wf[r] @ x)) <= bound


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_dot_matches_float(isa, qtype, rng):
    n = 200   # not a multiple of the vector width: exercises the tails
    w = random_rows(qtype, 4, n, rng)
    wf = dequantize(w, qtype).astype(np.float64) if qtype != T.F32 else w.view(np.float32).astype(np.float64)
    for r in range(4):
        x = rng.standard_normal(n).astype(np.float32)
        got = kernel_calls.vec_dot(isa, qtype, w[r], kernel_calls.quantize_act(qtype, x), n)
        ref = float(wf[r] @ x)
        assert abs(got - ref) <= FLOAT_RTOL * float(np.abs(wf[r] * x).sum()) + FLOAT_ATOL


@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_dequant_row_matches_gguf(qtype, rng):
    w = random_rows(qtype, 2, 512, rng)
    ref = dequantize(w, qtype) if qtype != T.F32 else w.view(np.float32)
    out = np.empty(512, np.float32)
    for r in range(2):
        row = np.ascontiguousarray(w[r])
        cpu_lib.lib.fm_dequant_row(int(qtype), cpu_lib.ptr(row), cpu_lib.ptr(out, "float *"), 512)
        np.testing.assert_array_equal(out, ref[r].astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q6_K, *IQ2_TYPES, *Q32_TYPES, *LOWBIT_TYPES, *IQ_LOWBIT_TYPES,
                                   T.F32, T.F16,
                                   T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_matvec_batch_matches_row_dots(isa, qtype, threads, rng):
    """Batches run the batched kernels (in chunks of 4 activations) where the ISA has them."""
    with kernel_calls.isa_restored(isa):
        pool = cpu_lib.Pool(threads)
        rows, n, batch = 300, 500 if qtype in FLOAT_TYPES else 512, 6   # float rows: a tail past the vectors
        w = random_rows(qtype, rows, n, rng)
        x = rng.standard_normal((batch, n)).astype(np.float32)
        y = kernel_calls.matvec(pool, qtype, w, x)
        for b in range(batch):
            act = kernel_calls.quantize_act(qtype, x[b])
            expect = np.array([kernel_calls.vec_dot(isa, qtype, w[r], act, n) for r in range(rows)], np.float32)
            scale = np.abs(dequantize(w, qtype) if qtype != T.F32 else w.view(np.float32)) @ np.abs(x[b])
            assert np.all(np.abs(y[b] - expect) <= SIBLING_RTOL * scale)
            # the same operations in the same order as the row kernel
            if qtype in FLOAT_TYPES + IQ2_TYPES + IQ_LOWBIT_TYPES:
                assert np.array_equal(y[b], expect)


LAYOUT_NAMES = {lib.FM_Q4_0X8: "Q4_0x8", lib.FM_Q4_KX8: "Q4_Kx8", lib.FM_Q6_KP: "Q6_Kp", lib.FM_Q4_0P: "Q4_0p",
                lib.FM_Q4_KP: "Q4_Kp"}
LAYOUTS = sorted(cpu_lib.LAYOUTS)
GROUPED_LAYOUTS = [lay for lay in LAYOUTS if cpu_lib.repack_group(lay) > 1]
ROW_LAYOUTS = [lay for lay in LAYOUTS if cpu_lib.repack_group(lay) == 1]


def source_type(layout: int) -> T:
    return T(cpu_lib.LAYOUTS[layout])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("na", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", GROUPED_LAYOUTS, ids=LAYOUT_NAMES.get)
def test_repacked_groups_match_generic_rows(isa, na, layout, rng):
    """A group of 8 repacked rows gives each row's generic dot, for every activation."""
    qtype = source_type(layout)
    w = random_rows(qtype, 16, N, rng)
    xs = (rng.standard_normal((na, N)) * rng.uniform(0.1, 10, (na, 1))).astype(np.float32)
    acts = [kernel_calls.quantize_act(qtype, x) for x in xs]
    packed = cpu_lib.repack(layout, w, N)
    assert packed.shape == w.shape and np.array_equal(np.sort(packed, axis=None), np.sort(w, axis=None))
    for g in range(2):
        got = kernel_calls.vec_dot_group(isa, layout, packed[8 * g:8 * g + 8], acts, N)
        for i, act in enumerate(acts):
            expect = np.array([kernel_calls.vec_dot("generic", qtype, w[r], act, N) for r in range(8 * g, 8 * g + 8)])
            scale = np.abs(dequantize(w[8 * g:8 * g + 8], qtype)) @ np.abs(xs[i])
            assert np.all(np.abs(got[i] - expect) <= SIBLING_RTOL * scale), (isa, na, g, i)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ROW_LAYOUTS, ids=LAYOUT_NAMES.get)
def test_repacked_rows_match_generic_rows(isa, layout, rng):
    """A type repacked row by row (Q6_Kp, Q4_0p, Q4_Kp), against activations in its order: each
    row's generic dot, over the whole range of quants and scales (random bytes, both signs of
    every scale)."""
    qtype = source_type(layout)
    w = random_rows(qtype, 24, N, rng)
    packed = cpu_lib.repack(layout, w, N)
    assert packed.shape == w.shape and not np.array_equal(packed, w)
    for x in (rng.standard_normal(N) * 3).astype(np.float32), np.linspace(-1, 1, N, dtype=np.float32):
        act, pact = kernel_calls.quantize_act(qtype, x), kernel_calls.quantize_act(layout, x)
        scale = np.abs(dequantize(w, qtype)) @ np.abs(x)
        got = np.array([kernel_calls.vec_dot(isa, layout, packed[r], pact, N) for r in range(len(w))])
        expect = np.array([kernel_calls.vec_dot("generic", qtype, w[r], act, N) for r in range(len(w))])
        assert np.all(np.abs(got - expect) <= SIBLING_RTOL * scale), isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ROW_LAYOUTS, ids=LAYOUT_NAMES.get)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("byte", [0xFF, 0x00], ids=["largest", "smallest"])
def test_repacked_rows_of_extreme_quants_stay_exact(isa, layout, sign, byte):
    """As test_extreme_quants_and_activations_stay_exact, through the row layouts: their int16
    sums over several registers, offset corrections included (quants.h), must not saturate."""
    qtype = source_type(layout)
    w, x = extreme_quants(qtype, byte), np.full(N, sign, np.float32)
    ref = float(dequantize(w, qtype).astype(np.float64)[0] @ x)
    got = kernel_calls.vec_dot(isa, layout, cpu_lib.repack(layout, w, N)[0], kernel_calls.quantize_act(layout, x), N)
    assert abs(got - ref) <= SIBLING_RTOL * abs(ref)


@pytest.mark.parametrize("isa", [i for i in ISAS if kernel_calls.has_rows_kernel(i, lib.FM_Q6_KP)])
@pytest.mark.parametrize("nr", range(1, kernel_calls.ROWS_AT_ONCE + 1))
@pytest.mark.parametrize("na", [1, 2, 3, 4])
def test_q6_kp_rows_at_once_match_generic_rows(isa, nr, na, rng):
    """The kernel for several Q6_Kp rows at once: each row's generic dot, for every activation."""
    qp = lib.FM_Q6_KP
    w = random_rows(T.Q6_K, nr, N, rng)
    packed = cpu_lib.repack(qp, w, N)
    xs = (rng.standard_normal((na, N)) * rng.uniform(0.1, 10, (na, 1))).astype(np.float32)
    got = kernel_calls.vec_dot_rows(isa, qp, packed, [kernel_calls.quantize_act(qp, x) for x in xs], N)
    assert got.shape == (na, nr)
    for i, x in enumerate(xs):
        act = kernel_calls.quantize_act(T.Q6_K, x)
        expect = np.array([kernel_calls.vec_dot("generic", T.Q6_K, w[r], act, N) for r in range(nr)])
        scale = np.abs(dequantize(w, T.Q6_K)) @ np.abs(x)
        assert np.all(np.abs(got[i] - expect) <= SIBLING_RTOL * scale), (isa, nr, na, i)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("C,K", [(8192, 4), (37, 4), (20, 3)])
def test_conv_update_matches_generic_and_float(isa, C, K, rng):
    """The conv update and SiLU: the same bits as the generic sibling (the same operations in
    the same order, vectorized across channels), and the float64 reference within FLOAT_RTOL."""
    state = rng.standard_normal((C, K - 1)).astype(np.float32)
    w, x = rng.standard_normal((C, K)).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    out, S = kernel_calls.conv_update(isa, state, w, x)
    gen_out, gen_S = kernel_calls.conv_update("generic", state, w, x)
    assert np.array_equal(out, gen_out) and np.array_equal(S, gen_S)
    window = np.concatenate([state, x[:, None]], axis=1).astype(np.float64)
    pre = (window * w).sum(axis=1)
    np.testing.assert_allclose(out, pre / (1 + np.exp(-pre)), rtol=FLOAT_RTOL, atol=FLOAT_RTOL)
    assert np.array_equal(S, window[:, 1:].astype(np.float32))


# The DeltaNet update in fp32 against float64: a state of |S| ~ 1 summed over dk rows twice.
GDN_RTOL = 1e-5
GDN_ATOL = 2e-5


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dk,dv", [(128, 128), (16, 40), (8, 3)])
def test_gdn_head_matches_generic_and_float(isa, dk, dv, rng):
    """The delta rule of one value head, S = decay S + k beta (v - decay S^T k)^T, o = S^T q:
    each ISA's kernel against float64 and the generic sibling, on widths with and without a
    column tail that fills no vector."""
    S = rng.standard_normal((dk, dv)).astype(np.float32)
    q, k = (rng.standard_normal(dk).astype(np.float32) / np.sqrt(dk) for _ in range(2))
    v = rng.standard_normal(dv).astype(np.float32)
    decay, beta = 0.93, 0.6
    S64 = decay * S.astype(np.float64)
    S64 += np.outer(k, beta * (v - S64.T @ k))
    o64 = S64.T @ q
    got_S, got_o = kernel_calls.gdn_head(isa, S, q, k, v, decay, beta)
    gen_S, gen_o = kernel_calls.gdn_head("generic", S, q, k, v, decay, beta)
    np.testing.assert_allclose(got_S, S64, rtol=GDN_RTOL, atol=GDN_ATOL)
    np.testing.assert_allclose(got_o, o64, rtol=GDN_RTOL, atol=GDN_ATOL)
    np.testing.assert_allclose(got_S, gen_S, rtol=GDN_RTOL, atol=GDN_ATOL)
    np.testing.assert_allclose(got_o, gen_o, rtol=GDN_RTOL, atol=GDN_ATOL)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_NAMES.get)
def test_matvec_reads_repacked_rows_like_the_gguf_layout(threads, layout, rng):
    """The driver runs whole groups of repacked rows, at any batch, on any split of tasks."""
    pool = cpu_lib.Pool(threads)
    rows, n, qtype = 8 * 200, 512, source_type(layout)
    w = random_rows(qtype, rows, n, rng)
    x = rng.standard_normal((6, n)).astype(np.float32)
    expect = kernel_calls.matvec(pool, qtype, w, x)
    got = kernel_calls.matvec(pool, layout, cpu_lib.repack(layout, w, n), x)
    scale = np.abs(dequantize(w, qtype)) @ np.abs(x).T
    assert np.all(np.abs(got - expect) <= SIBLING_RTOL * scale.T)


@pytest.mark.parametrize("threads", [2, 3])
def test_matvec_splits_a_large_matrix_into_tasks_that_cover_every_row(threads, rng):
    """Past the smallest task, a run's tasks grow with its bytes over the threads (matvec.c): a
    matrix of a few MB splits into tasks of a few hundred KB, the last one partial."""
    pool = cpu_lib.Pool(threads)
    rows, n = 1501, 4096   # 3.5 MB of Q4_0
    w = random_rows(T.Q4_0, rows, n, rng)
    x = rng.standard_normal((1, n)).astype(np.float32)
    got = kernel_calls.matvec(pool, T.Q4_0, w, x)[0]
    act = kernel_calls.quantize_act(T.Q4_0, x[0])
    expect = np.array([kernel_calls.vec_dot(cpu_lib.active_isa(), T.Q4_0, w[r], act, n) for r in range(rows)],
                      np.float32)
    assert np.array_equal(got, expect)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3, 6])
def test_matvec_reads_q6_kp_rows_in_any_number(threads, batch, rng):
    """Tasks whose rows are no multiple of the rows taken at once (1003 rows of 840 bytes: tasks
    of 312, the last 67), at batches under, at and over the activations of one call."""
    pool = cpu_lib.Pool(threads)
    rows, n = 1003, 1024
    w = random_rows(T.Q6_K, rows, n, rng)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    expect = kernel_calls.matvec(pool, T.Q6_K, w, x)
    got = kernel_calls.matvec(pool, lib.FM_Q6_KP, cpu_lib.repack(lib.FM_Q6_KP, w, n), x)
    scale = np.abs(dequantize(w, T.Q6_K)) @ np.abs(x).T
    assert np.all(np.abs(got - expect) <= SIBLING_RTOL * scale.T)


@pytest.mark.parametrize("threads", [2, 4])
def test_pool_runs_every_task_once_before_returning(threads):
    """200k jobs of 1..16 short tasks whose sizes change every job. A pool whose workers could read
    a new job's fields with the old job's counter ran about 1 task in 170 jobs twice, or returned
    before it finished (fm_pool_check counted over 1,100 on two threads)."""
    pool = cpu_lib.Pool(threads)
    assert lib.fm_pool_check(pool.ptr, 200_000, 16) == 0


def test_repack_refuses_partial_groups_and_blocks(rng):
    w = random_rows(T.Q4_0, 12, 64, rng)
    with pytest.raises(ValueError, match="groups of 8"):
        cpu_lib.repack(lib.FM_Q4_0X8, w, 64)
    with pytest.raises(ValueError, match="blocks of 128 values"):
        cpu_lib.repack(lib.FM_Q4_0P, w, 64)
    with pytest.raises(ValueError, match="not a repacked layout"):
        cpu_lib.repack(T.Q8_0, w, 64)
    with pytest.raises(ValueError, match="whole blocks of 128"):
        kernel_calls.quantize_act(lib.FM_Q4_0P, np.ones(96, np.float32))
    with pytest.raises(ValueError, match="repacked layout"):
        kernel_calls.vec_dot_group("generic", T.Q4_0, w[:8],
                                   [kernel_calls.quantize_act(T.Q4_0, np.ones(64, np.float32))], 64)


def test_checksum_sees_every_byte(rng):
    """Every length up to 80 bytes (whole chunks of 32, whole words, a tail), and a long one:
    flipping any one bit of any byte changes the checksum; so does a byte more or less."""
    for n in [*range(1, 81), 4099]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        base = cpu_lib.checksum(data)
        assert cpu_lib.checksum(data.copy()) == base
        for i in range(n) if n <= 80 else (0, 31, 32, 4095, 4098):
            changed = data.copy()
            changed[i] ^= 1 << (i % 8)
            assert cpu_lib.checksum(changed) != base, (n, i)
        assert cpu_lib.checksum(data[:-1]) != base
        assert cpu_lib.checksum(np.append(data, np.uint8(0))) != base


def test_activation_blocks_round_trip(rng):
    x = rng.standard_normal(512).astype(np.float32)
    a32 = kernel_calls.quantize_act(T.Q4_0, x)          # qs (16 x 32) | d (16) | s = d * sum(qs) (16)
    q = a32[:512].view(np.int8).astype(np.float32).reshape(16, 32)
    d, s = a32[512:].view(np.float32).reshape(2, 16)
    assert np.all(np.abs((q * d[:, None]).reshape(-1) - x) <= act_values(T.Q4_0, x) * ROUNDING_SLACK)
    np.testing.assert_allclose(s, d * q.sum(axis=1), rtol=1e-6)
    # qs | bsums | sums32 | d | padding
    a256 = kernel_calls.quantize_act(T.Q4_K, x).reshape(-1, 256 + 32 + 16 + 4 + 12)
    qs = a256[:, :256].view(np.int8).astype(np.float32)
    bsums = a256[:, 256:288].copy().view(np.int16)
    sums32 = a256[:, 288:304].copy().view(np.int16)
    d = a256[:, 304:308].copy().view(np.float32)
    np.testing.assert_array_equal(bsums, qs.reshape(-1, 16, 16).sum(axis=2))
    np.testing.assert_array_equal(sums32, qs.reshape(-1, 8, 32).sum(axis=2))
    assert np.all(np.abs((qs * d).reshape(-1) - x) <= act_values(T.Q4_K, x) * ROUNDING_SLACK)


def test_dispatch_picks_a_supported_isa_and_refuses_others():
    assert cpu_lib.active_isa() in ISAS
    assert "generic" in ISAS and "ssse3" in ISAS   # every x86-64 this project targets has SSSE3
    with pytest.raises(cpu_lib.IsaError, match="unknown ISA"):
        cpu_lib.select_isa("neon")
    for isa in set(cpu_lib.ISAS) - set(ISAS):
        with pytest.raises(cpu_lib.IsaError, match="cannot run"):
            cpu_lib.select_isa(isa)


def test_forced_isa_from_environment():
    code = "from native import cpu_lib; print(cpu_lib.active_isa())"
    env = dict(os.environ, FERMIUM_ISA="ssse3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "ssse3", out.stderr
    env["FERMIUM_ISA"] = "sse9"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "unknown ISA 'sse9'" in out.stderr


def test_physical_cores_counts_cores():
    assert 1 <= cpu_lib.physical_cores() <= (os.cpu_count() or 1)


def test_physical_cores_respects_cpu_affinity():
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert cpu_lib.physical_cores() == 1
    finally:
        os.sched_setaffinity(0, before)


def test_bandwidth_buffer_measures_again_and_refuses_less_than_a_huge_page():
    """A kept buffer gives a positive figure on every call, rounded down to whole 2 MiB pages; a
    size below one page is refused with a clear error, not a crash."""
    pool = cpu_lib.Pool(2)
    probe = cpu_lib.MemBandwidth(pool, (65 << 20) + 12345)
    assert probe.nbytes == 64 << 20
    assert all(cpu_lib.lib.fm_membw_run(probe.pool.ptr, probe.buf, 1) > 1e8 for _ in range(3))
    with pytest.raises(MemoryError):
        cpu_lib.MemBandwidth(pool, (2 << 20) - 1)


def test_bandwidth_streams_of_each_kind():
    """One pass of each kind gives its own figure, and the faster kind can be named."""
    pool = cpu_lib.Pool(1)
    probe = cpu_lib.MemBandwidth(pool, 64 << 20)
    assert probe.stream(False) > 1e8 and probe.stream(True) > 1e8
    assert probe.faster_stream(reps=1) in (True, False)
