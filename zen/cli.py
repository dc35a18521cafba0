"""`zen` command line: one subcommand per job, each living in the module that does the job.

A subcommand is a module exposing `add_arguments(parser)` and `run(args) -> int`, imported only when used,
so a heavy dependency of one job never slows down another. The library's own are listed here; others
register through the `zen.commands` entry-point group (the reproduction harness registers `bench`, `train`,
... in pyproject.toml): each names an object with `module` and `help` (and optionally `prepare()`, run first),
and is only found where it is installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
from typing import Any

from zen.cli_args import UsageError

COMMANDS = {
    "schemes": ("zen.cli_schemes", "list the registered synchronization schemes"),
    "build": ("zen.native.build", "build the native C++ (and CUDA) kernels"),
    "kernels-bench": ("zen.kernels_bench", "hashing + encoding throughput of the native kernels"),
}
GROUP = "zen.commands"


def commands() -> dict[str, tuple[str, str, Any]]:
    """Every subcommand: name -> (module, help, its registered object or None)."""
    found: dict[str, tuple[str, str, Any]] = {name: (m, h, None) for name, (m, h) in COMMANDS.items()}
    for ep in entry_points(group=GROUP):
        try:
            cmd = ep.load()
        except ImportError:  # registered by a package that is not importable here
            continue
        found.setdefault(ep.name, (cmd.module, cmd.help, cmd))
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known = commands()
    parser = argparse.ArgumentParser(prog="zen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text, _) in known.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in known:
        parser.parse_args(argv or ["--help"])
        return 2
    module_name, help_text, registered = known[argv[0]]
    if hasattr(registered, "prepare"):
        registered.prepare()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(f"zen {argv[0]}: {module_name} is not installed ({exc}); it belongs to the reproduction harness, "
              f"which runs from a checkout of the repository (make setup)", file=sys.stderr)
        return 2
    cmd = argparse.ArgumentParser(prog=f"zen {argv[0]}", description=help_text,
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    module.add_arguments(cmd)
    args = cmd.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UsageError as exc:
        print(f"zen {argv[0]}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
