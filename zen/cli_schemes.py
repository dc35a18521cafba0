"""`zen schemes`: list what `--schemes` and `scheme=` accept."""

from __future__ import annotations

import argparse

from zen.registry import schemes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    print("\n".join(schemes()))
    return 0
