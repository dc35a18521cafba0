"""Keep tool caches out of $HOME and make the repo importable by spawned ranks; hold every test that starts a
process to the `slow` marker (`make test-quick` runs the others); start the modules that launch the most first."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CACHE = tempfile.mkdtemp(prefix="zen-test-cache-")
for var, sub in (("XDG_CACHE_HOME", "xdg"), ("WANDB_DIR", "wandb"), ("MPLCONFIGDIR", "mpl")):
    os.environ.setdefault(var, str(Path(_CACHE, sub)))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.chdir(ROOT)


@pytest.fixture(scope="session")
def netem() -> None:
    """An emulated cluster can be made here (root or unprivileged user namespaces), else the test is skipped
    (found out once a session: a probe makes and removes a cluster)."""
    from .helpers import netem_unavailable

    why = netem_unavailable()
    if why:
        pytest.skip(f"no emulated cluster here (needs root or unprivileged user namespaces): {why}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with the most multi-process tests first, each kept whole: under `make test`'s workers
    (pytest-xdist, `--dist loadfile`: a module and its launch-once fixtures on one worker) the longest modules start
    at once and the in-process ones fill in behind them, instead of one long module starting last."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # stable: a module's own order stays


# What makes a test slow: ranks and their launchers (Python processes, torchrun, snakemake) and emulated clusters
# (namespaces). Tools a quick test may run in passing (git, the compiler a native build or its probe runs) are not.
_SLOW_PROGRAMS = ("python", "torchrun", "snakemake", "unshare", "nsenter")


@pytest.fixture(autouse=True)
def _slow_if_it_starts_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test not marked `slow` fails if it starts ranks, torchrun, snakemake, a Python subprocess or a cluster:
    `make test-quick` must stay free of them, and a missed marker shows here rather than in its run time."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    started: list[str] = []
    popen_init = subprocess.Popen.__init__

    def recorded(self: subprocess.Popen, args, *rest, **kwargs) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if Path(str(argv[0]).split()[0]).name.startswith(_SLOW_PROGRAMS):
            started.append(" ".join(map(str, argv))[:120])
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", recorded)
    yield
    assert not started, f"this test starts a process ({started[0]}): mark it @pytest.mark.slow"
