"""The seam every synchronization passes through: one frozen configuration (`SyncConfig`), one per-rank
`Synchronizer` that runs a call's `Part`s (zen.api and zen.ddp both use it)."""

from zen.sync.config import SyncConfig
from zen.sync.synchronizer import Outcome, Part, Synchronizer

__all__ = ["Outcome", "Part", "SyncConfig", "Synchronizer"]
