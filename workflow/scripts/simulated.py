"""Committed simulation outputs (results/simulated/): the paper's setting simulated by `make simulated`, which
does not fit the default `make`'s 30 minutes, kept with the commit, date and command that made each, and
judged stale when the code it came from (the schemes, their messages, the simulator, the traces' workloads)
has changed since.

`save` copies aggregated CSVs in and records where they came from; `load` (report.py) reads them back with
a line per file saying so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd

PROVENANCE = "provenance.json"
# What a simulation's numbers depend on: a change here since its commit makes it stale.
SOURCES = ("simulator", "baselines", "workloads", "zen/algorithms", "zen/core", "zen/comm", "zen/encodings",
           "zen/compress")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def stale(commit: str) -> str | None:
    """Why outputs of `commit` are out of date with this checkout's sources, or None when they are not."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return f"commit {commit} is not in this clone's history"
    changed = _git("diff", "--name-only", commit, "--", *(f":(top){p}" for p in SOURCES))
    if changed.returncode != 0:
        return "git could not compare"
    files = changed.stdout.split()
    return f"{len(files)} source files changed since (e.g. {files[0]})" if files else None


def save(src: Path, names: list[str], out: Path, command: str) -> dict:
    """Copy `src/<name>.csv` into `out` and record their commit (and whether sources were edited), date, command."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / PROVENANCE
    record = json.loads(path.read_text()) if path.exists() else {}
    commit = _git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    edited = bool(_git("status", "--porcelain", "--", *(f":(top){p}" for p in SOURCES)).stdout.strip())
    when = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}"
    for name in names:
        shutil.copyfile(src / f"{name}.csv", out / f"{name}.csv")
        record[name] = {"commit": commit, "edited": edited, "date": when, "command": command}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def load(folder: Path) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """Frames by name and, per name, where it came from ("git abc, 2026-12-05, `make simulated`; stale: ...")."""
    path = folder / PROVENANCE
    if not path.exists():
        return {}, {}
    frames, notes = {}, {}
    for name, rec in sorted(json.loads(path.read_text()).items()):
        csv = folder / f"{name}.csv"
        if not csv.exists():
            continue
        frames[name] = pd.read_csv(csv)
        why = stale(rec["commit"]) or ("sources were edited, uncommitted" if rec.get("edited") else None)
        notes[name] = (f"git {rec['commit']}, {rec['date']}, `{rec['command']}`"
                       + (f"; **stale**: {why}" if why else "; current (no source change since)"))
    return frames, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="commit simulation outputs with their provenance")
    parser.add_argument("--from", dest="src", type=Path, required=True, help="folder of the aggregated CSVs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", required=True, help="the command that made them")
    parser.add_argument("names", nargs="+", help="aggregate names (sim_paper, sim_fig8, ...)")
    args = parser.parse_args(argv)
    missing = [n for n in args.names if not (args.src / f"{n}.csv").exists()]
    if missing:
        parser.error(f"no {', '.join(missing)} in {args.src}")
    for name, rec in save(args.src, args.names, args.out, args.command).items():
        print(f"{name}: {rec}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
