"""moe_tiles on a GPU: each expert's first row and its tiles, as the host's grouping counts them."""
from __future__ import annotations

import numpy as np
import pytest

from native.cuda.kernels import GEMM_BM


def host_tiles(counts: np.ndarray, bm: int) -> tuple[np.ndarray, np.ndarray]:
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    tiles = [(e, first[e] + r0, min(bm, c - r0), 0) for e, c in enumerate(counts) for r0 in range(0, c, bm)]
    return first, np.array(tiles, np.int32).reshape(-1, 4)


@pytest.mark.parametrize("E, spread", [(256, "routed"), (64, "skewed"), (1024, "sparse"), (8, "routed")])
def test_moe_tiles_match_the_hosts_grouping(dev, E, spread):
    rng = np.random.default_rng(E)
    if spread == "routed":
        counts = rng.multinomial(4096 * 8, np.ones(E) / E)
    elif spread == "skewed":
        counts = rng.multinomial(947 * 8, rng.dirichlet(np.full(E, 0.2)))
    else:
        counts = np.where(rng.random(E) < 0.1, rng.integers(1, 200, E), 0)
    want_first, want_tiles = host_tiles(counts, GEMM_BM)
    cursor, tiles = dev.zeros(E, np.int32), dev.zeros((len(want_tiles) + 1, 4), np.int32)
    dev.k.moe_tiles(dev.s, dev.put(counts.astype(np.int32)), cursor, tiles, E, GEMM_BM)
    np.testing.assert_array_equal(dev.get(cursor, E, np.int32), want_first)
    got = dev.get(tiles, (len(want_tiles) + 1, 4), np.int32)
    np.testing.assert_array_equal(got[:len(want_tiles)], want_tiles)
    assert not got[len(want_tiles)].any()           # nothing written past the last tile
