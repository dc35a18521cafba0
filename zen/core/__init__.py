"""The seam every synchronization passes through: one frozen configuration (`SyncConfig`), one per-rank
`Synchronizer` that runs a call's `Part`s, and the one factory that builds it (`build`; zen.api, zen.ddp and
zen.fsdp use them). A package of its own name: `zen.sync` is the functional API's function."""

from zen.core.config import SyncConfig
from zen.core.synchronizer import Outcome, Part, Synchronizer

__all__ = ["Outcome", "Part", "SyncConfig", "Synchronizer"]
