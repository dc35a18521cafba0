"""Zen: sparsity-driven gradient synchronization (OSDI'25) with exact traffic accounting."""

from zen.api import SimResult, allreduce, simulate, sync
from zen.ddp import ZenHookState, ddp_hook, embedding_params
from zen.registry import make_scheme, register_scheme, schemes
from zen.types import SyncStats, ZenCommError, ZenError, ZenInputError

__all__ = [
    "SimResult", "SyncStats", "ZenCommError", "ZenError", "ZenHookState", "ZenInputError", "allreduce",
    "ddp_hook", "embedding_params", "make_scheme", "register_scheme", "schemes", "simulate", "sync",
]
__version__ = "0.1.0"
