"""Weights repacked for the SIMD kernels, cached on disk beside the model: built once, then
mapped read-only at each start. The layouts (native/cpu/quants.h) put 8 rows side by side, so
that one register holds a few values of each and the block scales of 8 rows are applied at once:
Q4_0 and Q4_K matrices (cpu_lib.REPACKED), which the AVX2 and AVX-512 kernels read 1.3 to 3
times as fast (native/cpu/selftest/selftest.c).

The file: a fixed prefix (magic, version, header length, data start, checksum of the data: of
each tensor's checksum, in order), a JSON header (the source file's size, modification time and
tensor table; each tensor's offset and size), zero padding to a page, then the tensors, each at
a page-aligned offset. A cache that
does not match in every part, or whose data fails the checksum, is rebuilt, never trusted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from common.model.gguf_file import GGUFModel, Tensor
from common.progress import byte_progress
from native import cpu_lib

MAGIC = b"FMREPACK"
VERSION = 2                         # bumped with any change to the file or a repacked layout
PREFIX = struct.Struct("<8sIIQQ")   # magic, version, header bytes, data start, data checksum
PAGE = 4096
SUFFIX = ".fermium-repack"
REPACK_ISAS = ("avx2", "avx512")    # the ISAs whose kernels read the repacked layout fast
NOT_REPACKED = ("token_embd.weight",)   # looked up a row at a time, in the GGUF layout
PROGRESS_BYTES = 1 << 30

log = logging.getLogger("fermium.decode")


class StaleCache(Exception):
    """Why a cache file cannot be used as it is."""


def repackable(t: Tensor) -> bool:
    return (int(t.qtype) in cpu_lib.REPACKED and len(t.shape) >= 2 and t.shape[-2] % 8 == 0
            and t.name not in NOT_REPACKED)


def source_id(model: GGUFModel) -> dict:
    """What the cache was built from: any change to the file changes one of these."""
    st = model.path.stat()
    table = hashlib.sha256()
    for e in model.file.entries:
        table.update(f"{e.name}:{e.ggml_type}:{e.ne}:{e.offset}\n".encode())
    return {"name": model.path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "tensors": table.hexdigest()}


def default_path(model: GGUFModel) -> Path:
    """Beside the model where its folder is writable, else in the user's cache folder."""
    beside = model.path.with_name(model.path.name + SUFFIX)
    if os.access(model.path.parent, os.W_OK):
        return beside
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fermium"
    tag = hashlib.sha256(str(model.path.resolve()).encode()).hexdigest()[:12]
    return root / f"{model.path.name}-{tag}{SUFFIX}"


class RepackCache:
    """A verified cache file, mapped read-only: the repacked bytes of each tensor it holds."""

    def __init__(self, path: Path, model: GGUFModel, names: list[str]):
        self.path = path
        if path.stat().st_size < PREFIX.size:
            raise StaleCache("shorter than its prefix")
        with open(path, "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.views = self._verify(model, names)   # a refused file is unmapped when collected

    def _verify(self, model: GGUFModel, names: list[str]) -> dict[str, np.ndarray]:
        mm = self._mmap
        magic, version, header_len, data_start, checksum = PREFIX.unpack_from(mm)
        if magic != MAGIC:
            raise StaleCache("not a Fermium repack cache")
        if version != VERSION:
            raise StaleCache(f"cache version {version}, this build writes {VERSION}")
        try:
            header = json.loads(mm[PREFIX.size:PREFIX.size + header_len])
        except ValueError as exc:
            raise StaleCache(f"unreadable header ({exc})") from None
        if header.get("source") != source_id(model):
            raise StaleCache("built from another version of the model file")
        tensors = header.get("tensors", {})
        if sorted(tensors) != sorted(names):
            raise StaleCache("holds other tensors than this build repacks")
        end = data_end(data_start, tensors)
        if len(mm) != end:
            raise StaleCache(f"{len(mm)} bytes, expected {end}")
        data = np.frombuffer(mm, np.uint8)
        views, sums = {}, {}
        for name in names:
            offset, nbytes = tensors[name]
            t = model.tensor(name)
            if nbytes != t.nbytes:
                raise StaleCache(f"{name}: {nbytes} bytes, the model's tensor has {t.nbytes}")
            views[name] = data[data_start + offset:data_start + offset + nbytes].reshape(t.raw.shape)
            sums[name] = cpu_lib.checksum(views[name])
        if data_checksum(sums, names) != checksum:
            raise StaleCache("its data fails the checksum")
        return views


def layout(model: GGUFModel, names: list[str]) -> tuple[bytes, int, dict[str, list[int]]]:
    """The header, the data start, and each tensor's [offset from the data start, bytes]."""
    tensors, offset = {}, 0
    for name in names:
        nbytes = model.tensor(name).nbytes
        tensors[name] = [offset, nbytes]
        offset += (nbytes + PAGE - 1) // PAGE * PAGE
    header = json.dumps({"source": source_id(model), "tensors": tensors}, sort_keys=True).encode()
    return header, (PREFIX.size + len(header) + PAGE - 1) // PAGE * PAGE, tensors


def data_end(data_start: int, tensors: dict[str, list[int]]) -> int:
    """The file's length: the end of its last tensor."""
    return data_start + max((o + b for o, b in tensors.values()), default=0)


def build(path: Path, model: GGUFModel, names: list[str],
          progress: Callable[[int, int], None] | None = None) -> None:
    """Write the cache to a temporary file beside `path`, then move it into place. One tensor
    at a time: repacked into a buffer and written, its source pages released from this process
    at once, so that the build holds one tensor's worth of memory beyond the model's own."""
    header, data_start, tensors = layout(model, names)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    total, done = sum(b for _, b in tensors.values()), 0
    sums = {}
    try:
        with open(tmp, "wb") as f:
            for name, source in zip(names, source_ranges(model, names)):
                t, (offset, nbytes) = model.tensor(name), tensors[name]
                packed = cpu_lib.repack(t.qtype, t.raw.reshape(-1, t.row_bytes), t.shape[-1])
                model.file.release([source])
                sums[name] = cpu_lib.checksum(packed)
                f.seek(data_start + offset)
                f.write(packed.data)
                done += nbytes
                if progress:
                    progress(done, total)
            f.truncate(data_end(data_start, tensors))
            f.seek(0)
            f.write(PREFIX.pack(MAGIC, VERSION, len(header), data_start, data_checksum(sums, names)))
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def data_checksum(sums: dict[str, int], names: list[str]) -> int:
    """One checksum over the tensors' own, in the header's order."""
    return cpu_lib.checksum(np.array([sums[n] for n in names], np.uint64))


def open_cache(model: GGUFModel, path: Path | None = None) -> RepackCache | None:
    """The model's repack cache, built first where missing, stale or corrupt. None when the
    model has nothing to repack, or when the cache cannot be written (no room, no permission):
    the engine then reads the GGUF layout. Building reads the source tensors once; their pages
    are then released from this process, which reads only the cache from there on."""
    names = [n for n, t in model.tensors.items() if repackable(t)]
    if not names:
        return None
    path = path or default_path(model)
    try:
        return RepackCache(path, model, names)
    except FileNotFoundError:
        log.info("building the repack cache %s (%d tensors)", path, len(names))
    except StaleCache as why:
        log.warning("rebuilding the repack cache %s: %s", path, why)
    try:
        build(path, model, names, byte_progress(log, "repacking", PROGRESS_BYTES))
    except OSError as exc:
        log.warning("could not write the repack cache %s (%s); decoding from the GGUF layout, "
                    "%.1f GiB more would be needed", path, exc.strerror or exc,
                    sum(model.tensor(n).nbytes for n in names) / 2**30)
        return None
    return RepackCache(path, model, names)


def source_ranges(model: GGUFModel, names: list[str]) -> list[tuple[int, int]]:
    """The byte ranges of these tensors in the model file."""
    entries = {e.name: e for e in model.file.entries}
    return [model.file.tensor_range(entries[n], model.tensor(n).nbytes) for n in names]
