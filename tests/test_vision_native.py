"""The vision tower on the native kernels (native/vision_runner.py, native/cpu/vision*.c) against the
numpy reference (common/reference/vision.py) on the same inputs, on every ISA this CPU runs: the
whole encoder on the tiny random models' mmproj files (f32, f16, q8_0) for images of 64x96 and
200x120, and the kernels one by one at shapes that take every tile path (several column blocks,
row and patch tiles with remainders, a head width that the SIMD attention pads)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from common.model.convert.quantize import quantize
from common.reference.ops import softmax
from common.reference.vision import VisionEncoder, gelu_erf, gelu_tanh, layer_norm, rotary_2d, rotate
from common.vision.preprocess import preprocess
from native import cpu_lib
from native.cpu_lib import Pool, ffi, lib, ptr
from native.vision_runner import ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE, Matrix, NativeVisionEncoder, gemm

from .vision_helpers import MMPROJ_TYPES, SIZES_FOR_INTEROP, rel_err, tiny_towers

ISAS = cpu_lib.supported_isas()
# both paths read the same dequantized weights in float32; only the summation order differs (over
# up to 4608 terms, through 2 blocks and the merger): 2e-5 of the largest output value
ENCODER_REL_TOL = 2e-5
# one GEMM of up to 600 terms in float32 against float64; GELU tanh through fm_expf (2 ulp)
GEMM_REL_TOL = 1e-5
# float32 softmax attention against float64, e^x within 2 ulp (fm_expf), outputs of size ~1
ATTN_ATOL = 5e-5
LN_ATOL = 1e-5


@pytest.fixture
def isa(request):
    before = cpu_lib.active_isa()
    yield cpu_lib.select_isa(request.param)
    cpu_lib.select_isa(before)


@pytest.fixture(scope="module")
def pool():
    return Pool(2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_towers(tmp_path_factory.mktemp("vl"))




@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("mmproj_type", MMPROJ_TYPES)
def test_encoder_as_the_reference(tiny, pool, isa, mmproj_type):
    vl, files = tiny
    mmproj = files[mmproj_type]
    ref, ours = VisionEncoder(mmproj), NativeVisionEncoder(mmproj, pool=pool)
    if mmproj_type == "q8_0":   # the file holds blocks that the GEMM reads in place
        assert ours.blocks[0]["qkv_w"].qtype == Q.Q8_0
    for height, width in SIZES_FOR_INTEROP:
        patches = preprocess(vl.image(height, width, seed=height), mmproj.config)
        want, got = ref.encode(patches), ours.encode(patches)
        assert got.shape == want.shape == (patches.n_tokens, mmproj.config.projection_dim)
        assert np.isfinite(got).all()
        assert rel_err(got, want) <= ENCODER_REL_TOL


def test_the_types_give_different_outputs(tiny, pool):
    # the same image through each file's own weights: a GEMM that ignored the type would agree
    vl, files = tiny
    patches = preprocess(vl.image(200, 120, seed=200), files["f32"].config)
    out = {t: NativeVisionEncoder(m, pool=pool).encode(patches) for t, m in files.items()}
    assert not np.array_equal(out["f32"], out["f16"]) and not np.array_equal(out["f16"], out["q8_0"])


def _matrix(qtype: Q, w: np.ndarray) -> tuple[Matrix, np.ndarray]:
    if qtype == Q.F32:
        return Matrix.f32(w), w
    raw = np.ascontiguousarray(quantize(w, qtype)).view(np.uint8).reshape(w.shape[0], -1)
    deq = dequantize(raw, qtype).astype(np.float32).reshape(w.shape)
    return Matrix(int(qtype), raw, *w.shape, raw.shape[1]), deq


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0])
@pytest.mark.parametrize("act", [ACT_NONE, ACT_GELU_TANH, ACT_GELU_ERF])
def test_gemm_over_tiles_with_remainders(pool, isa, qtype, act):
    # 600 columns: two whole blocks of 256 and a part; 150 rows: two tiles of 64 and a part; 401
    # patches: a tile of 384 and a part, the last microkernel short
    rng = np.random.default_rng(int(qtype) * 3 + act)
    n, rows, cols = 401, 150, 608 if qtype == Q.Q8_0 else 600
    x = rng.standard_normal((n, cols)).astype(np.float32)
    m, w = _matrix(qtype, (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32))
    bias = rng.standard_normal(rows).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    ref = {ACT_NONE: lambda a: a, ACT_GELU_TANH: gelu_tanh, ACT_GELU_ERF: gelu_erf}[act](ref.astype(np.float32))
    got = gemm(pool, m, x, bias, act)
    assert rel_err(got, ref) <= GEMM_REL_TOL
    if act == ACT_NONE:   # accumulate into y, and no bias
        y0 = rng.standard_normal((n, rows)).astype(np.float32)
        y = y0.copy()
        gemm(pool, m, x, None, out=y)
        assert rel_err(y - y0, (x.astype(np.float64) @ w.T.astype(np.float64))) <= GEMM_REL_TOL


def test_gemm_refuses_a_type_it_cannot_read(pool):
    x, y = np.zeros((4, 64), np.float32), np.zeros((4, 8), np.float32)
    w = np.zeros(8 * 64, np.uint8)
    assert lib.fm_vis_gemm(pool.ptr, int(Q.Q4_0), ptr(w), 36, 8, 64, 4, ptr(x, "float *"), 64,
                           ptr(y, "float *"), 8, ffi.NULL, 0, 0) == -1
    assert lib.fm_vis_gemm(pool.ptr, int(Q.Q8_0), ptr(w), 34, 8, 48, 4, ptr(x, "float *"), 48,
                           ptr(y, "float *"), 8, ffi.NULL, 0, 0) == -1
    m = Matrix.f32(np.zeros((8, 64), np.float32))
    with pytest.raises(ValueError, match="float32"):
        gemm(pool, m, np.zeros((4, 32), np.float32))
    with pytest.raises(ValueError, match="float32"):
        gemm(pool, m, x, out=np.zeros((4, 9), np.float32))


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_layer_norm(pool, isa):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((37, 1152)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(1152).astype(np.float32), rng.standard_normal(1152).astype(np.float32)
    y = np.empty_like(x)
    lib.fm_vis_layernorm(pool.ptr, ptr(x, "float *"), ptr(y, "float *"), 37, 1152, ptr(w, "float *"),
                         ptr(b, "float *"), 1e-6)
    assert np.abs(y - layer_norm(x.astype(np.float64), w, b, 1e-6)).max() <= LN_ATOL


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("n,heads,hd", [(150, 3, 72), (70, 2, 16), (300, 1, 40)])
def test_rotary_and_attention_over_all_patches(pool, isa, n, heads, hd):
    # 72 and 40 are no whole number of any ISA's panels; 150 and 300 keys no whole number of
    # panels or query blocks either, and 300 spans two blocks of keys
    rng = np.random.default_rng(n)
    rows, cols = rng.integers(0, 12, n), rng.integers(0, 9, n)
    cos, sin = (np.ascontiguousarray(a, np.float32) for a in rotary_2d(rows, cols, hd, 10000.0))
    qkv = (rng.standard_normal((n, 3 * heads * hd)) * 2).astype(np.float32)
    q, k, v = (np.empty((heads, n, hd), np.float32) for _ in range(3))
    lib.fm_vis_rotary_split(pool.ptr, ptr(qkv, "float *"), ptr(cos, "float *"), ptr(sin, "float *"), n, heads,
                            hd, ptr(q, "float *"), ptr(k, "float *"), ptr(v, "float *"))
    parts = qkv.reshape(n, 3, heads, hd)
    rq, rk = rotate(parts[:, 0], cos, sin), rotate(parts[:, 1], cos, sin)
    assert np.abs(q - rq.transpose(1, 0, 2)).max() <= 1e-5
    assert np.abs(k - rk.transpose(1, 0, 2)).max() <= 1e-5
    assert np.array_equal(v, parts[:, 2].transpose(1, 0, 2))
    o = np.empty((n, heads * hd), np.float32)
    scale = 1.0 / np.sqrt(hd)
    assert lib.fm_vis_attention(pool.ptr, ptr(q, "float *"), ptr(k, "float *"), ptr(v, "float *"), n, heads, hd,
                                scale, ptr(o, "float *")) == 0
    for h in range(heads):
        p = softmax((rq[:, h].astype(np.float64) @ rk[:, h].T.astype(np.float64)) * scale)
        assert p.max(axis=1).mean() > 0.1     # the scores are spread enough that a wrong key shows
        assert np.abs(o[:, h * hd:(h + 1) * hd] - p @ parts[:, 2, h].astype(np.float64)).max() <= ATTN_ATOL
