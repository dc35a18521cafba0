"""The reproduction harness: what regenerates the paper's figures around the library (microbenchmarks, the
emulated cluster, local rank launches, run provenance). It runs from a checkout and registers its commands
with the `zen` command line through entry points (pyproject.toml); the library never imports it."""
