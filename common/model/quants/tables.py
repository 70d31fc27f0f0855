"""The value tables of GGML's non-linear weight types: the i-quant grids, the sign patterns and
the 4-bit code books, as numpy arrays.

They are facts of the GGUF format, read from the `gguf` package's own definitions (which pack
each grid's bytes as 2- or 3-bit indices into a small value map), so the numpy reference, the C
kernels (native/iq_tables.h, written from here by tools/gen_iq_tables.py and checked against
here by tests/test_iq_tables.py) and the CUDA kernels read one source.

Shapes: a grid is (entries, values per entry); each value is what GGML stores in the grid's
bytes (IQ2_*: 0x08, 0x19, 0x2b; IQ3_XXS: 0x04..0x3e; IQ3_S: 1..15 odd; IQ1_S/IQ1_M: -1, 0, 1).
"""
from __future__ import annotations

import numpy as np
from gguf import quants as gq


def _grid(cls, dtype) -> np.ndarray:
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(cls.grid_shape).astype(dtype))


IQ2XXS_GRID = _grid(gq.IQ2_XXS, np.uint8)   # (256, 8)
IQ2XS_GRID = _grid(gq.IQ2_XS, np.uint8)     # (512, 8)
IQ2S_GRID = _grid(gq.IQ2_S, np.uint8)       # (1024, 8)
IQ3XXS_GRID = _grid(gq.IQ3_XXS, np.uint8)   # (256, 4)
IQ3S_GRID = _grid(gq.IQ3_S, np.uint8)       # (512, 4)
IQ1S_GRID = _grid(gq.IQ1_S, np.int8)        # (2048, 8)

# the 8 signs of an IQ2/IQ3 group from 7 stored bits: bit i of entry s is the sign of value i
# (the eighth makes the count of minus signs even)
KSIGNS_IQ2XS = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()   # (128,)

IQ1S_DELTA = float(gq.IQ1_S.delta)            # the shift of an IQ1_S/IQ1_M group: +-delta
KVALUES_IQ4NL = np.array(gq.IQ4_NL.kvalues, dtype=np.int8)   # (16,) IQ4_NL and IQ4_XS codes
KVALUES_MXFP4 = np.array(gq.MXFP4.kvalues, dtype=np.int8)    # (16,) E2M1 values, doubled

GRIDS = {
    "iq2xxs_grid": IQ2XXS_GRID, "iq2xs_grid": IQ2XS_GRID, "iq2s_grid": IQ2S_GRID,
    "iq3xxs_grid": IQ3XXS_GRID, "iq3s_grid": IQ3S_GRID, "iq1s_grid": IQ1S_GRID,
}
CODES = {"ksigns_iq2xs": KSIGNS_IQ2XS, "kvalues_iq4nl": KVALUES_IQ4NL, "kvalues_mxfp4": KVALUES_MXFP4}
