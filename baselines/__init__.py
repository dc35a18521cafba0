"""Baseline synchronization schemes, each self-registering into zen's scheme registry."""

from baselines import agsparse, allreduce  # noqa: F401  (registration side effects)
