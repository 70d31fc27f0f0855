"""native/iq_tables.h, which the C and CUDA kernels read, is what tools/gen_iq_tables.py writes
from common/model/quants/tables.py, and those tables are GGML's."""
from pathlib import Path

import numpy as np

from common.model.quants import tables
from tools.gen_iq_tables import render

ROOT = Path(__file__).resolve().parents[1]


def test_header_is_generated_from_the_tables():
    assert (ROOT / "native/iq_tables.h").read_text() == render(), "run tools/gen_iq_tables.py"


def test_grids_hold_ggml_values():
    # the first entries of GGML's grids, as ggml-common.h spells them
    assert list(tables.IQ2XXS_GRID[:3].view("<u8").reshape(-1)) == [
        0x0808080808080808, 0x080808080808082b, 0x0808080808081919]
    assert list(tables.IQ3XXS_GRID[:3].view("<u4").reshape(-1)) == [0x04040404, 0x04040414, 0x04040424]
    assert list(tables.IQ3S_GRID[:2].view("<u4").reshape(-1)) == [0x01010101, 0x01010103]
    assert list(tables.IQ1S_GRID[:2].view("<u8").reshape(-1)) == [0xffffffffffffffff, 0xffffffffffffff01]
    assert set(np.unique(tables.IQ2S_GRID)) == {0x08, 0x19, 0x2b}
    assert set(np.unique(tables.IQ3S_GRID)) == {1, 3, 5, 7, 9, 11, 13, 15}
    assert set(np.unique(tables.IQ1S_GRID)) == {-1, 0, 1}


def test_ksigns_have_even_parity():
    for s, byte in enumerate(tables.KSIGNS_IQ2XS):
        assert byte & 0x7F == s
        assert bin(int(byte)).count("1") % 2 == 0
