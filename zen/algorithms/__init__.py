"""Zen's own schemes, one self-registering module each (zen.registry.SCHEMES imports every module here):
Balanced Parallelism, Hierarchical Centralization, `zen` (which picks one of them per tensor) and the dense
all-reduce every part that is not the scheme's takes."""
