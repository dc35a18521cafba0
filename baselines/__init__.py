"""Baseline synchronization schemes, each self-registering into zen's scheme registry."""

from baselines import agsparse, allreduce, omnireduce, sparcml, sparse_ps  # noqa: F401  (self-registration)
