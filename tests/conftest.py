"""Keep tool caches out of $HOME and make the repo importable by spawned ranks."""

from __future__ import annotations

import os
import tempfile
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


@pytest.fixture(scope="module")
def netem() -> None:
    """An emulated cluster can be made here (root or unprivileged user namespaces), else the test is skipped."""
    from .helpers import netem_unavailable

    why = netem_unavailable()
    if why:
        pytest.skip(f"no emulated cluster here (needs root or unprivileged user namespaces): {why}")
