"""Weights repacked for the SIMD kernels, cached on disk beside the model: built once, then
mapped read-only at each start. The layouts (native/cpu/quants.h) hold the same bytes, reordered:
Q4_0 and Q4_K matrices with 8 rows side by side, so that one register holds a few values of each
and the block scales of 8 rows are applied at once (AVX2, AVX-512), or row by row with the nibbles
of 4 blocks side by side (SSSE3); Q6_K row by row, its quants rearranged to unpack in fewer
operations. REPACK_LAYOUTS says which layout each ISA reads each type in
(native/cpu/selftest/selftest.c and stream.c measure them).

The file: a fixed prefix (magic, version, header length, data start, checksum of the header), a
JSON header (the source file's size, modification time and tensor table; each tensor's offset,
size, layout and checksum), zero padding to a page, then the tensors, each at a page-aligned
offset. A start checks the tensors it uses. A cache that does not match in every part, or whose
data fails a checksum, is rebuilt, never trusted; one that lacks tensors that this ISA reads
repacked is rebuilt with them added (a tensor held in another ISA's layout is one it lacks).
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
from gguf import GGMLQuantizationType as Q

from common.model.gguf_file import GGUFModel, Tensor
from common.model.huge_pages import advise_huge_pages
from common.progress import byte_progress
from native import cpu_lib
from native.cpu_repack_lock import LockUnavailable, build_lock, clean_if_idle

MAGIC = b"FMREPACK"
VERSION = 6                         # bumped with any change to the file or a repacked layout
PREFIX = struct.Struct("<8sIIQQ")   # magic, version, header bytes, data start, header checksum
PAGE = 4096
SUFFIX = ".fermium-repack"
# The layout (cpu_lib.LAYOUTS) that each ISA reads each GGUF type in, where it reads it faster
# than the GGUF layout (docs/performance.md, "CPU kernel choices", has the figures):
# - SSSE3 reads Q4_0 and Q4_K row by row with the nibbles of 4 blocks or sub-blocks side by side
#   (Q4_0p, Q4_Kp): their `pmaddubsw` products add up as int16 before one `pmaddwd`. The groups
#   of 8 rows would cost it a shuffle per broadcast (native/cpu/q4x8_group_ssse3.c);
# - AVX2 and AVX-512 read Q4_0 and Q4_K in groups of 8 rows;
# - Q6_K is repacked everywhere: with AVX-512, `vpdpbusd` sums a Q6_Kp block's four registers
#   into one of 16 sub-block sums.
_AVX = {Q.Q4_0: cpu_lib.lib.FM_Q4_0X8, Q.Q4_K: cpu_lib.lib.FM_Q4_KX8, Q.Q6_K: cpu_lib.lib.FM_Q6_KP}
REPACK_LAYOUTS = {"ssse3": {Q.Q4_0: cpu_lib.lib.FM_Q4_0P, Q.Q4_K: cpu_lib.lib.FM_Q4_KP, Q.Q6_K: cpu_lib.lib.FM_Q6_KP},
                  "avx2": _AVX, "avx512": _AVX, "avx512vbmi": _AVX}
NOT_REPACKED = ("token_embd.weight",)   # looked up a row at a time, in the GGUF layout
PROGRESS_BYTES = 1 << 30

log = logging.getLogger("fermium.decode")


class StaleCache(Exception):
    """Why a cache file cannot be used as it is."""


class MissingTensors(StaleCache):
    """A sound cache without some tensors that are wanted now; `held` names those it has."""

    def __init__(self, missing: list[str], held: dict[str, int]):
        super().__init__(f"lacks {len(missing)} tensors in the layouts that this ISA reads")
        self.held = held   # tensor -> its layout in the cache


def layouts_for(isa: str | None = None) -> dict[int, int]:
    """GGUF type -> the layout that an ISA (default: the active one) reads it in."""
    return REPACK_LAYOUTS.get(isa or cpu_lib.active_isa(), {})


def repack_layout(t: Tensor, layouts: dict[int, int]) -> int | None:
    """The layout of `layouts` that this matrix is read in; None: the GGUF layout (another type,
    the embedding, or a shape that fills no whole group or block of the layout)."""
    layout = layouts.get(int(t.qtype))
    if layout is None or len(t.shape) < 2 or t.name in NOT_REPACKED:
        return None
    if t.shape[-2] % cpu_lib.repack_group(layout) or t.shape[-1] % cpu_lib.lib.fm_type_block(layout):
        return None
    return layout


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
    """A verified cache file, mapped read-only: the repacked bytes of the tensors asked for, in
    the layouts asked for (`layouts`: tensor -> layout)."""

    def __init__(self, path: Path, model: GGUFModel, wanted: dict[str, int]):
        self.path = path
        if path.stat().st_size < PREFIX.size:
            raise StaleCache("shorter than its prefix")
        with open(path, "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        advise_huge_pages(self._mmap)             # before the checksum reads it
        self.views = self._verify(model, wanted)  # a refused file is unmapped when collected
        self.layouts = dict(wanted)

    def _verify(self, model: GGUFModel, wanted: dict[str, int]) -> dict[str, np.ndarray]:
        mm = self._mmap
        magic, version, header_len, data_start, checksum = PREFIX.unpack_from(mm)
        if magic != MAGIC:
            raise StaleCache("not a Fermium repack cache")
        if version != VERSION:
            raise StaleCache(f"cache version {version}, this build writes {VERSION}")
        raw = mm[PREFIX.size:PREFIX.size + header_len]
        if len(raw) != header_len or cpu_lib.checksum(np.frombuffer(raw, np.uint8)) != checksum:
            raise StaleCache("its header fails the checksum")
        try:
            header = json.loads(raw)
            tensors = {k: (int(o), int(b), int(lay), int(c)) for k, (o, b, lay, c) in header["tensors"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise StaleCache(f"unreadable header ({exc!r})") from None
        if header.get("source") != source_id(model):
            raise StaleCache("built from another version of the model file")
        end = data_end(data_start, tensors)
        if len(mm) != end:
            raise StaleCache(f"{len(mm)} bytes, expected {end}")
        missing = [n for n, lay in wanted.items() if n not in tensors or tensors[n][2] != lay]
        if missing:
            raise MissingTensors(missing, {n: t[2] for n, t in tensors.items() if n in model.tensors})
        data = np.frombuffer(mm, np.uint8)
        views = {}
        for name in wanted:
            offset, nbytes, _, tensor_sum = tensors[name]
            t = model.tensor(name)
            if nbytes != t.nbytes:
                raise StaleCache(f"{name}: {nbytes} bytes, the model's tensor has {t.nbytes}")
            views[name] = data[data_start + offset:data_start + offset + nbytes].reshape(t.raw.shape)
            if cpu_lib.checksum(views[name]) != tensor_sum:
                raise StaleCache(f"{name} fails its checksum")
        return views


def file_layout(model: GGUFModel, plan: dict[str, int]) -> tuple[int, dict[str, list[int]]]:
    """The data start and each tensor's [offset from the data start, bytes, layout]."""
    tensors, offset = {}, 0
    for name, layout in plan.items():
        nbytes = model.tensor(name).nbytes
        tensors[name] = [offset, nbytes, layout]
        offset += (nbytes + PAGE - 1) // PAGE * PAGE
    # the header's room: its JSON with every checksum at its widest (20 digits)
    room = len(header_bytes(model, {n: [*t, 10**19] for n, t in tensors.items()}))
    return (PREFIX.size + room + PAGE - 1) // PAGE * PAGE, tensors


def header_bytes(model: GGUFModel, tensors: dict[str, list[int]]) -> bytes:
    return json.dumps({"source": source_id(model), "tensors": tensors}, sort_keys=True).encode()


def data_end(data_start: int, tensors: dict) -> int:
    """The file's length: the end of its last tensor."""
    return data_start + max((t[0] + t[1] for t in tensors.values()), default=0)


def build(path: Path, model: GGUFModel, plan: dict[str, int],
          progress: Callable[[int, int], None] | None = None) -> None:
    """Write the cache of the tensors of `plan`, each in its layout (tensor -> layout), to a
    temporary file beside `path`, then move it into place. One tensor at a time: repacked into a
    buffer and written, its source pages released from this process at once, so that the build
    holds one tensor's worth of memory beyond the model's own."""
    names = list(plan)
    data_start, tensors = file_layout(model, plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    total, done = sum(t[1] for t in tensors.values()), 0
    try:
        with open(tmp, "wb") as f:
            for name, source in zip(names, source_ranges(model, names)):
                t, (offset, nbytes, layout) = model.tensor(name), tensors[name]
                packed = cpu_lib.repack(layout, t.raw.reshape(-1, t.row_bytes), t.shape[-1])
                model.file.release([source])
                tensors[name].append(cpu_lib.checksum(packed))
                f.seek(data_start + offset)
                f.write(packed.data)
                done += nbytes
                if progress:
                    progress(done, total)
            f.truncate(data_end(data_start, tensors))
            header = header_bytes(model, tensors)
            f.seek(0)
            f.write(PREFIX.pack(MAGIC, VERSION, len(header), data_start,
                                cpu_lib.checksum(np.frombuffer(header, np.uint8))))
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_cache(model: GGUFModel, layouts: dict[int, int] | None = None,
               path: Path | None = None) -> RepackCache | None:
    """The repacked views of the model's tensors of the GGUF types of `layouts` (type -> layout;
    default: the active ISA's), from its cache file; the cache is built first where missing,
    stale or corrupt, and rebuilt with the tensors it lacks (or holds in another layout) added to
    the others it holds. None when there is nothing to repack, or when the cache cannot be written
    (no room, no permission): the runner then reads the GGUF layout. Building reads the source
    tensors once; their pages are then released from this process. One process builds, under
    the build lock (cpu_repack_lock.py); the others that open the cache meanwhile wait for it."""
    layouts = layouts_for() if layouts is None else layouts
    wanted = {n: lay for n, t in model.tensors.items() if (lay := repack_layout(t, layouts)) is not None}
    if not wanted:
        return None
    path = path or default_path(model)
    try:
        cache = RepackCache(path, model, wanted)
        clean_if_idle(path)
        return cache
    except (FileNotFoundError, StaleCache):
        pass                                  # told below, under the lock, where it is checked again
    try:
        with build_lock(path):
            return _open_or_build(path, model, wanted)
    except LockUnavailable as exc:
        log.warning("could not lock the repack cache %s (%s); decoding from the GGUF layout", path, exc)
        return None


def _open_or_build(path: Path, model: GGUFModel, wanted: dict[str, int]) -> RepackCache | None:
    plan = wanted
    try:
        return RepackCache(path, model, wanted)
    except FileNotFoundError:
        log.info("building the repack cache %s (%d tensors)", path, len(wanted))
    except MissingTensors as why:
        kept = {n: lay for n, lay in why.held.items() if n not in wanted and lay in cpu_lib.LAYOUTS
                and repack_layout(model.tensor(n), {cpu_lib.LAYOUTS[lay]: lay}) == lay}
        plan = {n: wanted.get(n, kept.get(n)) for n in model.tensors if n in wanted or n in kept}
        log.info("rebuilding the repack cache %s: it %s", path, why)
    except StaleCache as why:
        log.warning("rebuilding the repack cache %s: %s", path, why)
    try:
        build(path, model, plan, byte_progress(log, "repacking", PROGRESS_BYTES))
    except OSError as exc:
        log.warning("could not write the repack cache %s (%s); decoding from the GGUF layout, "
                    "%.1f GiB more would be needed", path, exc.strerror or exc,
                    sum(model.tensor(n).nbytes for n in plan) / 2**30)
        return None
    return RepackCache(path, model, wanted)


def source_ranges(model: GGUFModel, names: list[str]) -> list[tuple[int, int]]:
    """The byte ranges of these tensors in the model file."""
    entries = {e.name: e for e in model.file.entries}
    return [model.file.tensor_range(entries[n], model.tensor(n).nbytes) for n in names]
