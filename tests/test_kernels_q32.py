"""The kernels of the other blocks of 32 (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4; native/cpu/q32_*) at
their edge values: zero and the largest scales, every code, MXFP4's subnormal exponents, and the
batched kernels at every number of activations. The random cases are in test_kernels.py."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from native import cpu_lib
from tests import kernel_calls
from tests.test_kernels import FLOAT_ATOL, ISAS, Q32_TYPES, ROUNDING_SLACK, SIBLING_RTOL, N, act_values, random_rows

F16_MAX = np.array([65504.0], np.float16).view(np.uint8)
# the largest MXFP4 exponent whose values (12 * 2^(e - 128)) stay finite in float32 with room for a
# dot's sums; activations of about 2^-120 keep the dot near 1
MXFP4_LARGE_E, MXFP4_LARGE_X = 250, 2.0**-120
# a subnormal product of the block scales (MXFP4's exponents 0 and 1 are subnormal floats) keeps
# 2^-149 of absolute precision: each block's integer sum (at most 32 * 12 * 127) can then move by
# that much times one unit
SUBNORMAL_UNIT = 2.0**-149 * 32 * 12 * 127


def dequant_row(qtype: T, row: np.ndarray) -> np.ndarray:
    out = np.empty(N, np.float32)
    cpu_lib.lib.fm_dequant_row(int(qtype), cpu_lib.ptr(np.ascontiguousarray(row)), cpu_lib.ptr(out, "float *"), N)
    return out


def check_dots(qtype: T, w: np.ndarray, x: np.ndarray, extra: float = 0.0) -> None:
    """Every ISA's dot of each row of w against x: the generic one's within SIBLING_RTOL, and the
    float64 dot of gguf's dequantization within the activations' rounding (plus `extra`); the
    row dequantizer gives gguf's values."""
    wf = dequantize(w, qtype).astype(np.float64)
    act = kernel_calls.quantize_act(qtype, x)
    for r in range(len(w)):
        np.testing.assert_array_equal(dequant_row(qtype, w[r]), wf[r].astype(np.float32))
        generic = kernel_calls.vec_dot("generic", qtype, w[r], act, N)
        magnitude = float(np.abs(wf[r] * x).sum())
        bound = float(np.abs(wf[r]) @ act_values(qtype, x)) * ROUNDING_SLACK + FLOAT_ATOL * magnitude + extra
        assert abs(generic - float(wf[r] @ x)) <= bound, (r, generic, float(wf[r] @ x), bound)
        for isa in ISAS:
            got = kernel_calls.vec_dot(isa, qtype, w[r], act, N)
            assert abs(got - generic) <= SIBLING_RTOL * magnitude + extra, (isa, r, got, generic)


@pytest.mark.parametrize("qtype", [t for t in Q32_TYPES if t != T.MXFP4], ids=lambda t: t.name)
def test_zero_scales_give_zero(qtype, rng):
    """Scales (and mins) of zero under random codes: every ISA's dot is exactly 0."""
    w = random_rows(qtype, 4, N, rng)
    blocks = w.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    blocks[:, 0:2] = 0
    if qtype in (T.Q4_1, T.Q5_1):
        blocks[:, 2:4] = 0
    act = kernel_calls.quantize_act(qtype, rng.standard_normal(N).astype(np.float32))
    for r in range(len(w)):
        assert not dequant_row(qtype, w[r]).any()
        assert all(kernel_calls.vec_dot(isa, qtype, w[r], act, N) == 0.0 for isa in ISAS)


@pytest.mark.parametrize("qtype", Q32_TYPES, ids=lambda t: t.name)
def test_largest_scales(qtype, rng):
    """f16 scales and mins of 65504 (either sign for the mins); MXFP4's exponent 250."""
    w = random_rows(qtype, 4, N, rng)
    blocks = w.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    x = rng.standard_normal(N).astype(np.float32)
    if qtype == T.MXFP4:
        blocks[:, 0] = MXFP4_LARGE_E
        x *= np.float32(MXFP4_LARGE_X)
    else:
        blocks[:, 0:2] = F16_MAX
        if qtype in (T.Q4_1, T.Q5_1):
            blocks[:, 2:4] = F16_MAX
            blocks[::2, 3] |= 0x80   # every other min negative
    check_dots(qtype, w, x)


@pytest.mark.parametrize("qtype", Q32_TYPES, ids=lambda t: t.name)
def test_every_code(qtype, rng):
    """Quant bytes running through all 256 values (every pair of codes in one byte), the fifth
    bits all set, all clear and random."""
    w = random_rows(qtype, 3, N, rng)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = w.reshape(-1, nbytes)
    blocks[:, nbytes - 16:] = (np.arange(blocks.shape[0] * 16) % 256).reshape(-1, 16)
    if qtype in (T.Q5_0, T.Q5_1):
        qh = nbytes - 20
        per_row = N // block
        blocks[:per_row, qh:qh + 4] = 0xFF
        blocks[per_row:2 * per_row, qh:qh + 4] = 0
    check_dots(qtype, w, rng.standard_normal(N).astype(np.float32))


def test_mxfp4_subnormal_exponents(rng):
    """Exponents 0 and 1: scales 2^-128 and 2^-127, subnormal floats, exact in the row
    dequantizer; the dots keep the generic kernel's products within SUBNORMAL_UNIT a block."""
    w = random_rows(T.MXFP4, 4, N, rng)
    blocks = w.reshape(-1, GGML_QUANT_SIZES[T.MXFP4][1])
    blocks[:, 0] = rng.integers(0, 2, len(blocks))
    assert dequantize(w, T.MXFP4).any()
    check_dots(T.MXFP4, w, rng.standard_normal(N).astype(np.float32), extra=N // 32 * SUBNORMAL_UNIT)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", Q32_TYPES, ids=lambda t: t.name)
def test_batches_of_every_size_match_row_dots(isa, qtype, rng):
    """Batches of 1 to 5 activations (the batched kernels at 1..4 at once), rows of 416 values:
    8 blocks a step and a tail of 5 blocks."""
    rows, n = 40, 416
    w = random_rows(qtype, rows, n, rng)
    scale_of = np.abs(dequantize(w, qtype))
    with kernel_calls.isa_restored(isa):
        pool = cpu_lib.Pool(2)
        for batch in range(1, 6):
            x = (rng.standard_normal((batch, n)) * rng.uniform(0.1, 10, (batch, 1))).astype(np.float32)
            y = kernel_calls.matvec(pool, qtype, w, x)
            for b in range(batch):
                act = kernel_calls.quantize_act(qtype, x[b])
                expect = np.array([kernel_calls.vec_dot("generic", qtype, w[r], act, n) for r in range(rows)])
                assert np.all(np.abs(y[b] - expect) <= SIBLING_RTOL * (scale_of @ np.abs(x[b]))), (batch, b)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(4321)
