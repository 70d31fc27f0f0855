"""The Gated DeltaNet head update from one state buffer into another (a verify row writing its
rollback slot), with plain and with non-temporal stores, on every ISA this CPU has: the same
state and readout as the in-place update of the generic sibling, and the source left as it was."""
from __future__ import annotations

import numpy as np
import pytest

from native import cpu_lib
from native.cpu_lib import lib, ptr
from tests.kernel_calls import gdn_head, runnable_isa_index

ISAS = cpu_lib.supported_isas()
STREAM_ALIGN = 64        # bytes: the widest vector the streaming stores need
EXACT = 0.0              # the same operations in the same order as the in-place kernel


@pytest.fixture
def rng():
    return np.random.default_rng(31)


def aligned_floats(shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """A zeroed float32 array whose data starts `offset` bytes past a multiple of STREAM_ALIGN."""
    n = int(np.prod(shape))
    buf = np.zeros(n * 4 + 2 * STREAM_ALIGN, np.uint8)
    start = -buf.ctypes.data % STREAM_ALIGN + offset
    return buf[start:start + n * 4].view(np.float32).reshape(shape)


def gdn_head_to(isa: str, S0: np.ndarray, S: np.ndarray, q, k, v, decay: float, beta: float,
                stream: bool) -> np.ndarray:
    """One head through fm_gdn_head_to_isa: S0 -> S (in place when they are one array); returns o."""
    o = np.empty(S.shape[1], np.float32)
    q, k, v = (np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v))
    err = lib.fm_gdn_head_to_isa(runnable_isa_index(isa), ptr(S0, "float *"), ptr(S, "float *"), ptr(q, "float *"),
                                 ptr(k, "float *"), ptr(v, "float *"), decay, beta, ptr(o, "float *"),
                                 S.shape[0], S.shape[1], int(stream))
    assert err == 0
    return o


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dk,dv", [(128, 128), (16, 40), (8, 3)])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("offset", [0, 4], ids=["aligned", "unaligned"])
def test_out_of_place_update_matches_in_place(isa, dk, dv, stream, offset, rng):
    """Into another buffer, streamed or not, aligned or not (an unaligned one falls back to plain
    stores): bit for bit the kernel's own in-place result, and within rounding the generic one."""
    S0 = rng.standard_normal((dk, dv)).astype(np.float32)
    q, k = (rng.standard_normal(dk).astype(np.float32) / np.sqrt(dk) for _ in range(2))
    v = rng.standard_normal(dv).astype(np.float32)
    decay, beta = 0.91, 0.55
    before = S0.copy()
    S = aligned_floats((dk, dv), offset)
    S[...] = np.nan                      # every element must be written
    o = gdn_head_to(isa, S0, S, q, k, v, decay, beta, stream)
    want_S, want_o = gdn_head(isa, S0, q, k, v, decay, beta)
    gen_S, gen_o = gdn_head("generic", S0, q, k, v, decay, beta)
    assert np.array_equal(S0, before)
    np.testing.assert_allclose(S, want_S, rtol=EXACT, atol=EXACT)
    np.testing.assert_allclose(o, want_o, rtol=EXACT, atol=EXACT)
    np.testing.assert_allclose(S, gen_S, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(o, gen_o, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_in_place_with_stream_requested(isa, rng):
    """S0 and S one buffer with streaming asked for: the in-place update, unchanged."""
    dk = dv = 32
    S = aligned_floats((dk, dv))
    S[...] = rng.standard_normal((dk, dv))
    q, k, v = (rng.standard_normal(n).astype(np.float32) / 4 for n in (dk, dk, dv))
    want_S, want_o = gdn_head(isa, S, q, k, v, 0.8, 0.5)
    o = gdn_head_to(isa, S, S, q, k, v, 0.8, 0.5, True)
    np.testing.assert_allclose(S, want_S, rtol=EXACT, atol=EXACT)
    np.testing.assert_allclose(o, want_o, rtol=EXACT, atol=EXACT)
