"""The converter's quantizers, round-tripped through gguf-py's dequantizers, and its type policy."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from common.model.convert import kquants
from common.model.convert.quantize import FILE_TYPES, TensorSlot, choose_type, quantize, stored_nbytes

# Relative RMS error on gaussian rows, dequantize(quantize(x)) vs x. A wrong byte layout
# scrambles values and lands near 1.4, far above all of these.
REL_RMS = {
    Q.Q8_0: 0.006,   # 8-bit symmetric blocks of 32: step/sqrt(12) ~ 0.5% of the RMS
    Q.Q4_0: 0.095,   # 4-bit symmetric blocks of 32: about 8.6%
    Q.Q4_K: 0.08,    # 4-bit asymmetric sub-blocks of 32, searched scale/min: about 7.2%
    Q.Q5_K: 0.04,    # one more bit halves it: about 3.6%
    Q.Q6_K: 0.02,    # 6-bit symmetric sub-blocks of 16: about 1.8%
}
CONST_ROW_REL = 2e-3     # a constant row is on the grid; only the f16 scales round it


def _rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return (np.random.default_rng(7).standard_normal((96, 1024)) * 0.02).astype(np.float32)


@pytest.mark.parametrize("qtype", list(REL_RMS), ids=lambda q: q.name)
def test_round_trip_through_gguf_dequantize(rows, qtype):
    packed = quantize(rows, qtype)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    assert packed.dtype == np.uint8 and packed.shape == (96, 1024 // block * nbytes)
    assert packed.nbytes == stored_nbytes(rows.shape, qtype)
    back = dequantize(packed, qtype)
    assert back.shape == rows.shape
    assert _rel_rms(back, rows) < REL_RMS[qtype]


def test_k_quants_beat_the_plain_types(rows):
    err = {q: _rel_rms(dequantize(quantize(rows, q), q), rows) for q in REL_RMS}
    assert err[Q.Q4_K] < err[Q.Q4_0]           # same bits/weight class, better fit
    assert err[Q.Q5_K] < 0.6 * err[Q.Q4_K]
    assert err[Q.Q6_K] < 0.6 * err[Q.Q5_K]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_special_rows(qtype):
    x = np.zeros((4, 512), np.float32)
    x[1] = 0.75                                           # constant
    x[2] = np.abs(np.linspace(-1, 1, 512))                # all positive
    x[3, ::37] = 3.0                                      # sparse spikes
    back = dequantize(quantize(x, qtype), qtype)
    assert np.all(back[0] == 0)
    assert np.abs(back[1] - 0.75).max() < CONST_ROW_REL * 0.75
    assert _rel_rms(back[2], x[2]) < 4 * REL_RMS[qtype]
    assert np.isfinite(back).all() and _rel_rms(back[3], x[3]) < 4 * REL_RMS[qtype]


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_chunking_and_leading_axes_do_not_change_bytes(rows, kind, monkeypatch):
    whole = kquants.quantize_k(rows, kind)
    monkeypatch.setattr(kquants, "CHUNK_BLOCKS", 5)
    stacked = kquants.quantize_k(rows.reshape(4, 24, 1024), kind)
    assert stacked.shape == (4, 24, whole.shape[-1])
    assert np.array_equal(stacked.reshape(whole.shape), whole)


def test_k_quant_rejects_short_rows():
    with pytest.raises(ValueError, match="multiple of 256"):
        kquants.quantize_k(np.zeros((2, 128), np.float32), "Q4_K")


# ---- which type each tensor gets

def _pick(name: str, shape: tuple[int, ...], ft: str, n_layers: int = 8) -> Q:
    return choose_type(TensorSlot(name, shape, n_layers), FILE_TYPES[ft])


@pytest.mark.parametrize("ft", list(FILE_TYPES))
def test_always_f32(ft):
    for name, shape in [("blk.0.attn_norm.weight", (256,)), ("blk.0.ssm_a", (32,)),
                        ("blk.0.ssm_dt.bias", (32,)), ("blk.0.ffn_gate_inp.weight", (256, 2048)),
                        ("blk.0.ffn_gate_inp_shexp.weight", (1, 2048)),
                        ("blk.0.ssm_conv1d.weight", (8192, 4)), ("blk.3.attn_q_norm.weight", (256,))]:
        assert _pick(name, shape, ft) == Q.F32, (name, ft)


def test_q4_k_m_mix_follows_llama_cpp():
    big = (4096, 2048)
    assert _pick("output.weight", big, "q4_k_m") == Q.Q6_K
    assert _pick("token_embd.weight", big, "q4_k_m") == Q.Q4_K
    assert _pick("blk.0.attn_qkv.weight", big, "q4_k_m") == Q.Q5_K
    # use_more_bits for 8 layers: 0 (first eighth), 3 and 6 (every third), 7 (last eighth)
    more = [i for i in range(8) if _pick(f"blk.{i}.ffn_down_exps.weight", (8, 2048, 512),
                                         "q4_k_m") == Q.Q6_K]
    assert more == [0, 3, 6, 7]
    assert _pick("blk.3.attn_v.weight", big, "q4_k_m") == Q.Q6_K
    assert _pick("blk.1.attn_v.weight", big, "q4_k_m") == Q.Q4_K
    assert _pick("blk.0.ssm_alpha.weight", (32, 2048), "q4_k_m") == Q.F32
    assert _pick("blk.0.ssm_alpha.weight", (32, 2048), "q8_0") == Q.Q8_0


def test_row_fallbacks():
    assert _pick("blk.0.ssm_out.weight", (2048, 4096), "q4_k_m") == Q.Q4_K
    assert _pick("blk.0.ssm_out.weight", (64, 96), "q4_k_m") == Q.Q8_0      # 96 % 256
    assert _pick("blk.0.ssm_out.weight", (64, 100), "q4_k_m") == Q.F16      # 100 % 32
    assert _pick("blk.0.ssm_out.weight", (64, 100), "q8_0") == Q.F16
    assert _pick("output.weight", (300, 64), "q4_0") == Q.Q8_0               # Q6_K needs 256
    assert _pick("output.weight", (300, 512), "q4_0") == Q.Q6_K
