"""Write native/iq_tables.h, the i-quant grids and code books for the C and CUDA kernels, from
common/model/quants/tables.py (tests/test_iq_tables.py checks that the header matches it).

    python tools/gen_iq_tables.py [OUT]      (default native/iq_tables.h)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.model.quants import tables  # noqa: E402

HEADER = """/* iq_tables.h: the value tables of GGML's i-quant and code-book weight types (grids, sign
 * patterns, 4-bit code books), written by tools/gen_iq_tables.py from
 * common/model/quants/tables.py; edit those, not this. An entry of a grid packs its values as
 * bytes, value i in byte i (little-endian), as GGML stores them. The includer defines
 * FM_IQ_TABLE as the arrays' qualifier (`static const` in C, `__device__ const` in CUDA). */
#ifndef FERMIUM_IQ_TABLES_H
#define FERMIUM_IQ_TABLES_H
#include <stdint.h>
#ifndef FM_IQ_TABLE
#define FM_IQ_TABLE static const
#endif
"""


def packed(grid: np.ndarray) -> tuple[str, list[int]]:
    """Each row's bytes as one little-endian word: uint64 for 8 values, uint32 for 4."""
    width = grid.shape[1]
    ctype, dtype = {8: ("uint64_t", "<u8"), 4: ("uint32_t", "<u4")}[width]
    return ctype, [int(w) for w in grid.astype(np.uint8).view(dtype).reshape(-1)]


def array(ctype: str, name: str, values: list[int], per_line: int, fmt: str) -> str:
    lines = [", ".join(fmt.format(v) for v in values[i:i + per_line]) for i in range(0, len(values), per_line)]
    return f"FM_IQ_TABLE {ctype} fm_{name}[{len(values)}] = {{\n    " + ",\n    ".join(lines) + ",\n};\n"


def render() -> str:
    out = [HEADER]
    for name, grid in tables.GRIDS.items():
        ctype, words = packed(grid)
        fmt = "0x{:016x}" if ctype == "uint64_t" else "0x{:08x}"
        out.append(array(ctype, name, words, 4 if ctype == "uint64_t" else 8, fmt))
    out.append(array("uint8_t", "ksigns_iq2xs", [int(v) for v in tables.KSIGNS_IQ2XS], 16, "{}"))
    out.append(array("int8_t", "kvalues_iq4nl", [int(v) for v in tables.KVALUES_IQ4NL], 16, "{}"))
    out.append(array("int8_t", "kvalues_mxfp4", [int(v) for v in tables.KVALUES_MXFP4], 16, "{}"))
    out.append(f"#define FM_IQ1S_DELTA {tables.IQ1S_DELTA!r}f\n")
    out.append("#endif\n")
    return "\n".join(out)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "native/iq_tables.h"
    target.write_text(render())
    print(f"wrote {target}")
