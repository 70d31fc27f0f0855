"""The 3- and 1-bit i-quant kernels (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) on their edges: every grid index
and sign pattern, both delta signs, the smallest and largest block scales. Each ISA's dot gives the
generic kernel's bits (the same integer sums and float steps, native/cpu/iq_lowbit.h), and the
generic one gguf's float dequantization within the activation rounding bound."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from native import cpu_lib
from tests import kernel_calls
from tests.test_kernels import FLOAT_ATOL, IQ_LOWBIT_TYPES, ISAS, ROUNDING_SLACK, act_values
from tools.synthetic_blocks import MAKERS


def covering_blocks(qtype: T, rng) -> np.ndarray:
    """(nb, bytes) blocks in which every grid index (with both delta signs for IQ1) and every sign
    pattern occurs, the sub-block scales cycling through all their values, d 1."""
    nb = {T.IQ3_XXS: 4, T.IQ3_S: 8, T.IQ1_S: 128, T.IQ1_M: 128}[qtype]
    b = rng.integers(0, 256, (nb, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    if qtype == T.IQ3_XXS:   # qs: 64 indices per block; 8 words of 4 x 7 sign bits and a 4-bit scale
        b[:, 2:66] = np.arange(256).reshape(nb, 64)
        fields = np.arange(128, dtype=np.uint32).reshape(-1, 4)
        words = fields[:, 0] | fields[:, 1] << 7 | fields[:, 2] << 14 | fields[:, 3] << 21
        words |= (np.arange(len(words), dtype=np.uint32) % 16) << 28
        b[:, 66:98] = words.reshape(nb, 8).view(np.uint8)
    elif qtype == T.IQ3_S:   # qs 64 | qh 8 | signs 32 | scales 4
        index = np.arange(512).reshape(nb, 8, 8)
        b[:, 2:66] = (index & 255).reshape(nb, 64)
        b[:, 66:74] = ((index >> 8) << np.arange(8)).sum(axis=2)
        b[:, 74:106] = np.arange(256).reshape(nb, 32)
        nibbles = (np.arange(8 * nb) % 16).reshape(nb, 4, 2)
        b[:, 106:110] = nibbles[..., 0] | nibbles[..., 1] << 4
    elif qtype == T.IQ1_S:   # qs 32 | qh 8 x uint16: 4 x 3 index bits, 3-bit scale, delta sign
        index = np.arange(4096).reshape(nb, 8, 4)   # the delta sign (bit 11) shared by each 4
        b[:, 2:34] = (index & 255).reshape(nb, 32)
        qh = (((index >> 8) & 7) << (3 * np.arange(4))).sum(axis=2) | np.arange(8) << 12
        qh |= (index[:, :, 0] >> 11) << 15
        b[:, 34:50] = qh.astype(np.uint16).view(np.uint8)
    else:                    # qs 32 | qh 16 (a nibble per index: 3 bits and the delta sign) | scales
        index = np.arange(4096).reshape(nb, 32)
        b[:, 0:32] = index & 255
        b[:, 32:48] = (index[:, 0::2] >> 8) | (index[:, 1::2] >> 8) << 4
        fields = np.arange(16).reshape(4, 4) % 8    # the 16 3-bit scales, each value twice
        b[:, 48:56] = (fields << (3 * np.arange(4))).sum(axis=1).astype(np.uint16).view(np.uint8)
    MAKERS[qtype].scale(b, np.ones(nb))
    return b.reshape(1, -1)


def check_row(qtype: T, w: np.ndarray, x: np.ndarray) -> None:
    """Every ISA's dot equals the generic one's bits; the generic one is within the rounding bound
    of gguf's dequantized row; the native row dequantizer gives gguf's floats."""
    n = x.size
    act = kernel_calls.quantize_act(qtype, x)
    generic = kernel_calls.vec_dot("generic", qtype, w[0], act, n)
    for isa in ISAS:
        assert kernel_calls.vec_dot(isa, qtype, w[0], act, n) == generic, isa
    wf = dequantize(w, qtype).astype(np.float64)[0]
    magnitude = max(1.0, float(np.abs(wf) @ np.abs(x)))
    bound = float(np.abs(wf) @ act_values(qtype, x)) * ROUNDING_SLACK + FLOAT_ATOL * magnitude
    assert abs(generic - float(wf @ x)) <= bound
    out = np.empty(n, np.float32)
    row = np.ascontiguousarray(w[0])
    cpu_lib.lib.fm_dequant_row(int(qtype), cpu_lib.ptr(row), cpu_lib.ptr(out, "float *"), n)
    np.testing.assert_array_equal(out, wf.astype(np.float32))


@pytest.fixture
def rng():
    return np.random.default_rng(41)


@pytest.mark.parametrize("qtype", IQ_LOWBIT_TYPES, ids=lambda t: t.name)
def test_every_grid_index_and_sign_pattern(qtype, rng):
    w = covering_blocks(qtype, rng)
    n = w.shape[1] // GGML_QUANT_SIZES[qtype][1] * 256
    for x in (rng.standard_normal(n) * 2).astype(np.float32), np.full(n, -1.0, np.float32):
        check_row(qtype, w, x)


@pytest.mark.parametrize("qtype", IQ_LOWBIT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("d", [0.0, 6e-8, 65504.0], ids=["zero", "subnormal", "largest"])
def test_zero_subnormal_and_largest_block_scales(qtype, d, rng):
    """d of every block 0, the smallest f16 subnormal, or the largest f16 (with random sub-block
    scales and the largest ones), against random and all-at-+-127 activations."""
    w = covering_blocks(qtype, rng)
    nb = w.shape[1] // GGML_QUANT_SIZES[qtype][1]
    blocks = w.reshape(nb, -1)
    MAKERS[qtype].scale(blocks, np.full(nb, d))
    n = nb * 256
    for x in rng.standard_normal(n).astype(np.float32), np.full(n, 1.0, np.float32):
        check_row(qtype, w, x)
        if d == 0.0:
            assert kernel_calls.vec_dot("generic", qtype, w[0], kernel_calls.quantize_act(qtype, x), n) == 0.0


@pytest.mark.parametrize("qtype", IQ_LOWBIT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5])
def test_batched_kernels_give_the_row_kernels_bits(qtype, batch, rng):
    """The matvec of a batch (the batched kernels, FM_DOTN_MAX activations per call) equals each
    activation's one-row dot, on every ISA."""
    rows, n = 40, 1024
    block, nbytes = GGML_QUANT_SIZES[qtype]
    w = rng.integers(0, 256, (rows * n // block, nbytes), dtype=np.uint8)
    MAKERS[qtype].scale(w, rng.uniform(1e-3, 4e-3, len(w)))
    w = w.reshape(rows, -1)
    x = (rng.standard_normal((batch, n)) * rng.uniform(0.1, 10, (batch, 1))).astype(np.float32)
    for isa in ISAS:
        with kernel_calls.isa_restored(isa):
            y = kernel_calls.matvec(cpu_lib.Pool(2), qtype, w, x)
        for i in range(batch):
            act = kernel_calls.quantize_act(qtype, x[i])
            expect = [kernel_calls.vec_dot("generic", qtype, w[r], act, n) for r in range(rows)]
            assert np.array_equal(y[i], np.array(expect, np.float32)), (isa, i)
