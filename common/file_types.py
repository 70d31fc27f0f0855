"""The files of a model that would fit this machine: llama-quantize's file types
(common/model/quants/mixes.py) priced tensor by tensor for the model at hand, for the refusal of
a file too large for the RAM (common.config.check_memory)."""
from __future__ import annotations

from typing import Any

import numpy as np

from common.model.quants.mixes import MIXES, file_sizes
from common.sequence_memory import SequenceMemory, model_file_bytes, size_text

SMALLER_NAMED = 5      # file types a refusal names, the largest that fit first


def file_type_sizes(model: Any) -> list[tuple[str, int, float]]:
    """This model's file in each llama-quantize file type (common/model/quants/mixes.py), largest
    first: (name, estimated bytes, bits per weight). Each is priced tensor by tensor; the
    metadata counts at its bytes in this file."""
    tensors = [(t.name, t.shape, t.nbytes) for t in model.tensors.values()]
    params = sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in tensors)
    overhead = max(0, model_file_bytes(model) - sum(n for _, _, n in tensors))
    sizes = [(name, n + overhead, 8 * n / params) for name, n in file_sizes(tensors).items() if MIXES[name].advised]
    return sorted(sizes, key=lambda f: -f[1])


def files_that_fit(model: Any, ram: int, mem: SequenceMemory) -> str:
    """The end of a refusal: the file types whose file and `mem` fit `ram`, the largest first;
    else the --ctx-size with which the smallest would; else that none does ("" without a model)."""
    if model is None:
        return ""
    sizes = file_type_sizes(model)
    fits = [f for f in sizes if f[1] + mem.total_bytes <= ram]
    if fits:
        return "; files of this model that would fit, by bits per weight: " + ", ".join(
            f"{name.upper()} about {size_text(n)} ({bpw:.2f} bpw)" for name, n, bpw in fits[:SMALLER_NAMED])
    name, n, _ = sizes[-1]
    per_token = mem.kv_bytes_per_token
    fit_ctx = (ram - n - mem.fixed_bytes) // per_token if per_token else 0
    if fit_ctx > 0:
        return (f"; beside this context no llama-quantize file type of this model fits: the smallest, "
                f"{name.upper()}, about {size_text(n)}, would with --ctx-size {fit_ctx}")
    return f"; no llama-quantize file type of this model fits (the smallest, {name.upper()}, about {size_text(n)})"
