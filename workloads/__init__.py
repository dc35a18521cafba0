"""Embedding-heavy workloads (LSTM, BERT, GPT-2, DLRM) whose gradients Zen synchronizes."""

from workloads.base import PRESETS, Workload, build_workload, builtin_workloads, register_workload, workload_names

__all__ = ["PRESETS", "Workload", "build_workload", "builtin_workloads", "register_workload", "workload_names"]
