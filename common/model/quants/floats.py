"""The float types: F32, F16 and BF16 (the top half of an F32), one value per block."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T


def _f32(b: np.ndarray) -> np.ndarray:
    return b.view(np.float32)                                   # (n, 4) -> (n, 1)


def _f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)                # (n, 2) -> (n, 1)


def _bf16(b: np.ndarray) -> np.ndarray:
    return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


TYPES = {T.F32: (1, 4, _f32), T.F16: (1, 2, _f16), T.BF16: (1, 2, _bf16)}
