"""The kernel benchmark (`zen kernels-bench`): the native kernels' throughput, paper Figure 16."""
