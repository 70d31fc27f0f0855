"""Position-indexed snapshots of sequence state (see store.py)."""
from .store import KV_BLOCK, SnapshotStore, StoreStats

__all__ = ["KV_BLOCK", "SnapshotStore", "StoreStats"]
