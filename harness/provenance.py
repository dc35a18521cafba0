"""Where a result came from, and how it is written: versions, git revision, atomic files.

Every run's output carries `versions()` and `git()`, and is written with `write_atomic`, so a reader (the
pipeline, a plot) never sees a half-written file and can always say which code made it.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of `path` to write (e.g. with torch.save), renamed over `path` on success and
    removed on failure: an interrupted run never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` to `path` through `atomic_file`."""
    with atomic_file(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Rows (dicts with the same keys) as a CSV with a header, written atomically."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buf.getvalue())


def write_json(path: str | Path, obj: Any, indent: int | None = 1) -> None:
    write_atomic(path, json.dumps(obj, indent=indent, default=str))


def version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    from zen import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "zen": __version__,
            "wandb": version("wandb"), "cuda": torch.version.cuda, "platform": platform.platform()}


def git() -> dict[str, Any]:
    """The checkout's revision and whether tracked files differ from it (None outside a git checkout); the
    pipeline's committed outputs under results/ (report, figures) do not count as a change to the code."""
    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = run("status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)results")
    return {"revision": run("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}
