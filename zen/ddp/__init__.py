"""DDP integration: the communication hook, its state, and how a bucket is split into parts."""

from zen.ddp.hook import StepRecord, ZenHookState, ddp_hook
from zen.ddp.router import BucketRouter, Part, embedding_params

__all__ = ["BucketRouter", "Part", "StepRecord", "ZenHookState", "ddp_hook", "embedding_params"]
