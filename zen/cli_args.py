"""Argument types and the usage error of the `zen` subcommands: a bad value is one line and exit status 2."""

from __future__ import annotations

import argparse
import math
import re


class UsageError(Exception):
    """A bad command-line value found after parsing; `zen` prints it as one line and exits with 2."""


def count(text: str) -> int:
    """A positive element count: 1048576, 1e6 or 2^20."""
    m = re.fullmatch(r"\s*(\d+)\s*\^\s*(\d+)\s*", text)
    try:
        value = float(int(m[1]) ** int(m[2])) if m else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 1048576, 1e6, 2^20)") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(value)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def world_sizes(text: str) -> list[int]:
    """Comma-separated world sizes, each >= 2 (a single rank has nothing to synchronize)."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"world sizes must be >= 2, got {text!r}")
    return sizes
