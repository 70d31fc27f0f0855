"""The vision tower on the GPU (native/cuda/vision.cu, native/cuda/vision.py) against the numpy
reference (common/reference/vision.py) on the same inputs: the whole encoder on the tiny random
models' mmproj files (f32, f16, q8_0) for images of 64x96 and 200x120, and the kernels one by one at
shapes that take every remainder (a width that is no whole tile of 32, tiles of patches and weight
rows cut short, a head of 72)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from common.model.convert.quantize import quantize
from common.reference.ops import softmax
from common.reference.vision import VisionEncoder, gelu_erf, gelu_tanh, layer_norm, rotary_2d, rotate
from common.vision.preprocess import preprocess
from native.cuda.vision import ACT_GELU_ERF, ACT_GELU_TANH, ACT_NONE, CudaVisionEncoder, VisionKernels

from ..vision_helpers import MMPROJ_TYPES, SIZES_FOR_INTEROP, rel_err, tiny_towers

# both read the same dequantized weights in fp32; other summation orders, expf and erff on the device
ENCODER_REL_TOL = 2e-5
GEMM_REL_TOL = 1e-5      # up to 600 fp32 terms against float64
ATTN_ATOL = 5e-5         # online softmax in fp32 against float64
LN_ATOL = 1e-5

rng = np.random.default_rng(11)


@pytest.fixture(scope="module")
def vk(dev):
    return VisionKernels()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_towers(tmp_path_factory.mktemp("vl"))




@pytest.mark.parametrize("mmproj_type", MMPROJ_TYPES)
def test_encoder_as_the_reference(dev, vk, tiny, mmproj_type):
    vl, files = tiny
    mmproj = files[mmproj_type]
    ours = CudaVisionEncoder(mmproj, vk)
    try:
        if mmproj_type == "q8_0":
            assert ours.blocks[0]["qkv_w"].qtype == Q.Q8_0
        for height, width in SIZES_FOR_INTEROP:
            patches = preprocess(vl.image(height, width, seed=height), mmproj.config)
            want, got = VisionEncoder(mmproj).encode(patches), ours.encode(patches)
            assert got.shape == want.shape and np.isfinite(got).all()
            assert rel_err(got, want) <= ENCODER_REL_TOL
    finally:
        ours.free()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("act", [ACT_NONE, ACT_GELU_TANH, ACT_GELU_ERF])
def test_gemm_with_remainders(dev, vk, qtype, act):
    n, rows, cols = 150, 100, 608 if qtype == Q.Q8_0 else 600      # 600: no whole tile of 32
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    raw = w if qtype == Q.F32 else np.ascontiguousarray(quantize(w, qtype)).view(np.uint8).reshape(rows, -1)
    wd = w if qtype == Q.F32 else dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
    bias = rng.standard_normal(rows).astype(np.float32)
    y0 = rng.standard_normal((n, rows)).astype(np.float32)
    y = dev.put(y0)
    vk.gemm(dev.s, qtype, x=dev.put(x), ldx=cols, y=y, ldy=rows, w=dev.put(raw), row_bytes=raw.nbytes // rows,
            bias=dev.put(bias), n=n, rows=rows, cols=cols, accumulate=True, act=act)
    act_fn = {ACT_NONE: lambda a: a, ACT_GELU_TANH: gelu_tanh, ACT_GELU_ERF: gelu_erf}[act]
    want = y0 + act_fn((x.astype(np.float64) @ wd.T.astype(np.float64) + bias).astype(np.float32))
    assert rel_err(dev.get(y, (n, rows)) - y0, want - y0) <= GEMM_REL_TOL


def test_layer_norm_rotary_and_attention(dev, vk):
    n, heads, hd = 150, 3, 72
    x = (rng.standard_normal((n, 1152)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(1152).astype(np.float32), rng.standard_normal(1152).astype(np.float32)
    y = dev.zeros((n, 1152))
    vk.layer_norm(dev.s, dev.put(x), y, dev.put(w), dev.put(b), n, 1152, 1e-6)
    assert np.abs(dev.get(y, (n, 1152)) - layer_norm(x.astype(np.float64), w, b, 1e-6)).max() <= LN_ATOL

    rows, cols = rng.integers(0, 12, n), rng.integers(0, 9, n)
    cos, sin = (np.ascontiguousarray(a, np.float32) for a in rotary_2d(rows, cols, hd, 10000.0))
    qkv = (rng.standard_normal((n, 3 * heads * hd)) * 2).astype(np.float32)
    q, k, v, o = (dev.zeros((heads, n, hd)) for _ in range(4))
    vk.rotary_split(dev.s, dev.put(qkv), dev.put(cos), dev.put(sin), q, k, v, n, heads, hd)
    parts = qkv.reshape(n, 3, heads, hd)
    rq, rk = rotate(parts[:, 0], cos, sin), rotate(parts[:, 1], cos, sin)
    assert np.abs(dev.get(q, (heads, n, hd)) - rq.transpose(1, 0, 2)).max() <= 1e-5
    assert np.abs(dev.get(k, (heads, n, hd)) - rk.transpose(1, 0, 2)).max() <= 1e-5
    assert np.array_equal(dev.get(v, (heads, n, hd)), parts[:, 2].transpose(1, 0, 2))
    vk.attention(dev.s, q, k, v, o, n, heads, hd)
    got = dev.get(o, (n, heads * hd))
    for h in range(heads):
        p = softmax((rq[:, h].astype(np.float64) @ rk[:, h].T.astype(np.float64)) / np.sqrt(hd))
        assert np.abs(got[:, h * hd:(h + 1) * hd] - p @ parts[:, 2, h].astype(np.float64)).max() <= ATTN_ATOL
