"""Microbenchmark harness: synthetic sparsity patterns, simulated and real runs, nccl-tests style table."""
