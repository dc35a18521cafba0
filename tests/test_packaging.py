"""The packaging files parse and agree with each other."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==")
            out[name.lower().replace("_", "-")] = version
    return out


def test_environment_yml_parses_and_pins_the_gpu_set() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "zen"
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pinned = {p.split("==")[0]: p.split("==")[1] for p in pip if "==" in p}
    assert pinned["torch"].startswith("2.14") and pinned["fbgemm-gpu"].startswith("1.9")
    assert "torchrec" not in pinned  # installed with --no-deps after creation (documented in the file)
    assert "pip install --no-deps torchrec" in (ROOT / "environment.yml").read_text()
    lock = pins(ROOT / "requirements.lock")
    for shared in ("snakemake", "wandb", "transformers", "pandas"):
        assert pinned[shared] == lock[shared], shared
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    cuda = next(d for d in conda if d.startswith("cuda-version="))
    index = next(p for p in pip if "download.pytorch.org/whl/cu" in p)  # torch's CUDA build: cu130 is 13.0
    wheel_cuda = index.rsplit("/cu", 1)[1]
    assert cuda.split("=")[1] == f"{wheel_cuda[:-1]}.{wheel_cuda[-1]}", (cuda, index)
    assert "cuda-nvcc" in conda  # a CUDA compiler that matches torch's CUDA


def test_cpu_lock_pins_the_cpu_torch_and_matching_torchrec() -> None:
    lock = pins(ROOT / "requirements.lock")
    assert lock["torch"].startswith("2.13.0")
    assert lock["torchrec"] == "1.8.0" and lock["fbgemm-gpu-cpu"] == "1.8.0"


def test_pyproject_declares_packages_and_console_script() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["zen"] == "zen.cli:main"
    assert set(meta["tool"]["setuptools"]["packages"]["find"]["include"]) >= {"zen*", "baselines*", "workloads*"}
