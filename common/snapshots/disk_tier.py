"""The snapshot store's methods for its disk tier: one file per snapshot (disk.py), written by a
thread of its own (disk_writer.py), within a byte budget.

The store keeps `on_disk`, key -> file size, in least-recently-used order (written, or looked up),
for the files that it wrote or found at start. A write that takes their total past the budget
removes the least recently used files; one that is only on disk leaves the index with its file.
`load_ahead`, run off the event loop before a request's lookup, reads a file into RAM there.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..state import STATE_DTYPE, SequenceState, state_specs
from . import disk
from .disk_writer import Job
from .snapshot import Snapshot


def _spell(specs: list, i: int) -> str:
    return f"{specs[i][0].str}{list(specs[i][1])}" if i < len(specs) else "missing"


class DiskTierMethods:
    """Mixed into SnapshotStore (store.py), whose lock, index and RAM tier these use."""

    @property
    def disk_bytes(self) -> int:
        return self.disk_total

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the disk writer has written (or failed) everything queued; False after `timeout`."""
        return self.disk_writer is None or self.disk_writer.flush(timeout)

    def _path(self, key: bytes) -> Path:
        return self.disk_dir / f"{key.hex()}.snap"

    def _queue_write(self, key: bytes, snap, blocks: list[bytes]) -> None:
        """Queue the file of a snapshot that RAM holds; its arrays are the store's, never written to."""
        kv = [self.kv_blocks[b] for b in blocks]
        recurrent, logits, tail_k, tail_v = snap.recurrent, snap.logits, snap.tail_k, snap.tail_v

        def arrays() -> list[np.ndarray]:
            ks = [np.concatenate([*(k[i] for k, _ in kv), t]) for i, t in enumerate(tail_k)]
            vs = [np.concatenate([*(v[i] for _, v in kv), t]) for i, t in enumerate(tail_v)]
            return [*recurrent, *ks, *vs, logits]

        meta = {"base": snap.base.hex(), "blocks": [b.hex() for b in blocks], "rope_delta": snap.rope_delta}
        self.disk_writer.put(Job(key, self._path(key), snap.pos, meta, arrays))

    def _disk_written(self, job: Job, size: int | None) -> None:
        """The writer's report: index the file (by its meta, if RAM let go of it meanwhile), then
        remove the least recently used files past the budget."""
        if size is None:
            return
        with self.lock:
            self.disk_total += size - self.on_disk.pop(job.key, 0)
            self.on_disk[job.key] = size
            if job.key not in self.snaps:
                meta = job.meta
                self._index(job.key, Snapshot(job.pos, bytes.fromhex(meta["base"]),
                                              [bytes.fromhex(b) for b in meta["blocks"]], None, None,
                                              rope_delta=meta["rope_delta"]))
            victims = self._over_budget()
        self._remove_files(victims)

    def _over_budget(self) -> list[bytes]:
        """Under the lock: take the least recently used files off the index until the rest fit."""
        victims = []
        while self.disk_budget and self.disk_total > self.disk_budget and self.on_disk:
            key, size = self.on_disk.popitem(last=False)
            self.disk_total -= size
            snap = self.snaps.get(key)
            if snap is not None and snap.recurrent is None:
                self._forget(key)                         # only on disk: gone with its file
            victims.append(key)
        return victims

    def _remove_files(self, keys: list[bytes]) -> None:
        for key in keys:
            disk.remove(self._path(key))
            self.events("evicted")

    def _disk_gone(self, key: bytes) -> None:
        self.disk_total -= self.on_disk.pop(key, 0)

    def _touch(self, key: bytes) -> None:
        if key in self.on_disk:
            self.on_disk.move_to_end(key)

    def _fits(self, path: Path, header: dict) -> dict:
        """The header of a file that this model and block size can use, else CorruptSnapshot."""
        from .keys import ROOT
        pos, base, blocks = header["pos"], header["meta"]["base"], header["meta"]["blocks"]
        if base != (blocks[-1] if blocks else ROOT.hex()) or not 0 <= pos - len(blocks) * self.block < self.block:
            raise disk.CorruptSnapshot(f"{path}: position {pos}, base and {len(blocks)} blocks disagree")
        specs = [*state_specs(pos, self.cfg, self.kv_type), ("logits", np.dtype(STATE_DTYPE), (self.cfg.vocab_size,))]
        names = [name for name, _, _ in specs]
        got, want = header["specs"], [(d, s) for _, d, s in specs]
        if got != want:
            i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise disk.CorruptSnapshot(f"{path}: {names[i] if i < len(names) else f'array {i}'} is "
                                       f"{_spell(got, i)}, this model's is {_spell(want, i)}")
        return header

    def _index_disk(self) -> None:
        """At start: index every whole file, oldest first, and keep the newest within the budget."""

        def stat(p: Path) -> tuple[float, int]:
            try:
                st = p.stat()
                return st.st_mtime, st.st_size
            except OSError:
                return 0.0, 0

        for path in sorted(self.disk_dir.glob("*.snap"), key=stat):
            header = disk.drop_if_corrupt(lambda p: self._fits(p, disk.read_header(p)), path)
            if header is None:
                self.stats.disk_rejected += 1
                continue
            meta, key = header["meta"], bytes.fromhex(header["key"])
            snap = Snapshot(header["pos"], bytes.fromhex(meta["base"]),
                            [bytes.fromhex(b) for b in meta["blocks"]], None, None,
                            rope_delta=meta.get("rope_delta", 0))
            self._index(key, snap)
            self.on_disk[key] = stat(path)[1]
            self.disk_total += self.on_disk[key]
        self._remove_files(self._over_budget())

    def _read_fitting(self, path: Path, snap) -> tuple[SequenceState, np.ndarray]:
        header, arrays = disk.read_checked(path)
        self._fits(path, header)
        meta = header["meta"]
        if ((header["pos"], meta["base"], meta["blocks"], meta.get("rope_delta", 0))
                != (snap.pos, snap.base.hex(), [b.hex() for b in snap.blocks], snap.rope_delta)):
            raise disk.CorruptSnapshot(f"{path}: not the snapshot that was indexed under its name")
        try:
            return (SequenceState.from_arrays(snap.pos, arrays[:-1], self.cfg, self.kv_type, snap.rope_delta),
                    arrays[-1])
        except ValueError as exc:
            raise disk.CorruptSnapshot(f"{path}: {exc}") from exc

    def load_ahead(self, tokens, marks=()) -> int:
        """Read the file of the longest stored prefix of `tokens` into RAM when only the disk holds
        it, so that lookup, on the event loop, finds it there. Reads without the store's lock;
        call it off the event loop. Returns the position loaded, 0 for none."""
        with self.lock:
            best = self._longest(tokens, marks)
            snap = self.snaps.get(best) if best is not None else None
            if snap is None or snap.recurrent is not None:
                return 0
        loaded = disk.drop_if_corrupt(lambda p: self._read_fitting(p, snap), self._path(best))
        with self.lock:
            if self.snaps.get(best) is not snap or snap.recurrent is not None:
                return 0                                  # another thread got there first, or it left
            return snap.pos if self._install(best, snap, loaded) else 0

    def _load_from_disk(self, key: bytes) -> bool:
        snap = self.snaps[key]
        return self._install(key, snap, disk.drop_if_corrupt(lambda p: self._read_fitting(p, snap), self._path(key)))

    def _install(self, key: bytes, snap, loaded) -> bool:
        """Under the lock: the arrays read from a snapshot's file into RAM; a corrupt file (None) is forgotten."""
        if loaded is None:
            self.stats.disk_rejected += 1
            self._disk_gone(key)
            self._forget(key)
            return False
        state, logits = loaded
        B = self.block
        for i, bkey in enumerate(snap.blocks):
            if bkey not in self.kv_blocks:
                self.kv_blocks[bkey] = ([k[i * B:(i + 1) * B].copy() for k in state.k],
                                        [v[i * B:(i + 1) * B].copy() for v in state.v])
            self.refs[bkey] = self.refs.get(bkey, 0) + 1
        n = len(snap.blocks) * B
        snap.recurrent = [a.copy() for a in [*state.conv, *state.ssm]]
        snap.logits = logits.copy()
        snap.tail_k, snap.tail_v = [k[n:].copy() for k in state.k], [v[n:].copy() for v in state.v]
        self.snaps.move_to_end(key)
        self._evict()
        return self.snaps.get(key) is snap and snap.recurrent is not None
