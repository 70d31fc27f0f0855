"""Position-indexed snapshots of sequence state (see store.py)."""
from .store import SnapshotStore, StoreStats

__all__ = ["SnapshotStore", "StoreStats"]
