"""A fast GGUF header reader: metadata and tensor directory, with the data memory-mapped.

gguf's own GGUFReader builds a numpy view per array element, which takes tens of seconds for
a real Qwen vocabulary (248k tokens and merges). This reader walks the header once with
`struct` over a memory map; values come back as plain Python objects (lists for arrays, a
numpy array for large numeric arrays). The type codes and layout are the GGUF v2/v3 spec's.
"""
from __future__ import annotations

import errno
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from gguf import GGUFValueType

from .huge_pages import advise_huge_pages

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MADV_POPULATE_READ = 22            # linux/mman.h; not in the mmap module before Python 3.13
PREFAULT_CHUNK = 256 << 20         # a multiple of the page size
_SCALAR = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
           GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
           GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
           GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}


class GGUFFormatError(ValueError):
    pass


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ne: tuple[int, ...]          # ggml order: ne[0] is the contiguous dimension
    ggml_type: int
    offset: int                  # from the start of the data section


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated header at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated string at byte {self.pos}")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _SCALAR:                                  # numeric arrays in one go
                dtype = np.dtype(_SCALAR[etype])
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise GGUFFormatError(f"{self.path}: truncated array at byte {self.pos}")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos = end
                return arr.tolist()
            return [self.value(etype) for _ in range(count)]
        if vtype not in _SCALAR:
            raise GGUFFormatError(f"{self.path}: unknown value type {vtype} at byte {self.pos}")
        return self.take(_SCALAR[vtype])


def whole_pages(start: int, end: int) -> tuple[int, int]:
    """The pages that lie wholly inside [start, end): (first page start, last page end); empty
    when the end is not past the start."""
    return -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE


class FastGGUF:
    """Header parsed eagerly (fast), data left in the memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            try:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:                             # empty file
                raise GGUFFormatError(f"{self.path}: empty file") from exc
        advise_huge_pages(self._mmap)                         # before any page is read
        cur = _Cursor(self._mmap, self.path)
        if self._mmap[:4] != GGUF_MAGIC:
            raise GGUFFormatError(f"{self.path}: not a GGUF file (bad magic)")
        cur.pos = 4
        self.version = cur.take("<I")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {self.version}, supported: 2, 3")
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        self.fields: dict[str, object] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.fields[key] = cur.value(cur.take("<I"))
        self.entries: list[TensorEntry] = []
        for _ in range(n_tensors):
            name = cur.string()
            ne = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
            self.entries.append(TensorEntry(name, ne, cur.take("<I"), cur.take("<Q")))
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_offset = (cur.pos + align - 1) // align * align
        self.data = np.frombuffer(self._mmap, dtype=np.uint8)   # the same mapping: see prefault

    def prefault(self, progress: Callable[[int, int], None] | None = None,
                 skip: Sequence[tuple[int, int]] = ()) -> None:
        """Map every page of the file into this process now, as llama.cpp's MAP_POPULATE does, so
        that decoding never stops on a page fault for weights touched the first time (a new
        expert, most often). Reads from disk what is not in the page cache yet. `skip`: byte
        ranges (start, end) whose whole pages stay unmapped: weights read from elsewhere.
        progress(bytes_done, bytes_total) is called after each chunk."""
        spans = self._pages_outside(skip)
        total, done = sum(end - start for start, end in spans), 0
        for span_start, span_end in spans:
            for start in range(span_start, span_end, PREFAULT_CHUNK):
                length = min(PREFAULT_CHUNK, span_end - start)
                try:
                    self._mmap.madvise(MADV_POPULATE_READ, start, length)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:   # an I/O error or a file cut short: say so
                        raise OSError(exc.errno, f"{self.path}: could not map the model into memory: "
                                                 f"{exc.strerror}") from exc
                    self._mmap.madvise(mmap.MADV_WILLNEED, start, length)   # before Linux 5.14:
                    int(self.data[start:start + length:mmap.PAGESIZE].sum())  # touch each page
                done += length
                if progress:
                    progress(done, total)

    def release(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Drop the whole pages of these byte ranges from this process (they stay in the page
        cache): weights that are read from elsewhere after a one-off pass over them."""
        for start, end in ranges:
            lo, hi = whole_pages(start, end)
            if hi > lo:
                self._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def tensor_range(self, entry: TensorEntry, nbytes: int) -> tuple[int, int]:
        start = self.data_offset + entry.offset
        return start, start + nbytes

    def _pages_outside(self, skip: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """[0, file size) less the whole pages of each skipped range, as page-aligned spans."""
        spans, at = [], 0
        for start, end in sorted(skip):
            lo, hi = whole_pages(start, end)
            if hi <= lo:
                continue
            if lo > at:
                spans.append((at, lo))
            at = max(at, hi)
        if at < len(self._mmap):
            spans.append((at, len(self._mmap)))
        return spans

    def tensor_bytes(self, entry: TensorEntry, nbytes: int) -> np.ndarray:
        start = self.data_offset + entry.offset
        if start + nbytes > len(self.data):
            raise GGUFFormatError(f"{self.path}: tensor {entry.name} runs past the end of the file "
                                  f"(truncated download?)")
        return self.data[start:start + nbytes]
