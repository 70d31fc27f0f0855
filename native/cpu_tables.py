"""Pointers into numpy arrays for the native step's arguments, made through cffi's view of the
array's buffer (ffi.from_buffer). numpy's `a.ctypes.data` builds ctypes objects on every call,
several times the cost, and a decode step or a speculative cycle takes tens of such pointers
(one per layer's state and cache). The arrays must be C-contiguous (from_buffer refuses others),
and they, not the pointers, keep the memory alive."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from native.cpu_lib import ffi


def _view(ctype: str, a: np.ndarray):
    return ffi.from_buffer("char[]" if ctype == "void" else f"{ctype}[]", a)


def pointer(ctype: str, a: np.ndarray):
    """`ctype *` to a's first element."""
    return ffi.cast(f"{ctype} *", _view(ctype, a))


def table(ctype: str, arrays: Sequence[np.ndarray]):
    """A `ctype *[]` of the arrays' first elements (one NULL entry when there are none)."""
    return ffi.new(f"{ctype} *[]", [_view(ctype, a) for a in arrays] or 1)


def same_start(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the two arrays' data begin at the same address."""
    return ffi.from_buffer(a) == ffi.from_buffer(b)
