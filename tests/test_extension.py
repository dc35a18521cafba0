"""A scheme, a pull encoding and a compressor are one file each: CONTRIBUTING.md's three worked examples,
written to scratch copies of their packages, are registered, pass the checks the parametrised tests run on
every registered one, and join the pipeline's grid."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a Python process of its own: the examples' files go on its packages' paths

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)

RUN = r"""
import json, sys
import torch, yaml
import zen.algorithms, zen.compress, zen.encodings
for package, folder in (("algorithms", zen.algorithms), ("encodings", zen.encodings), ("compress", zen.compress)):
    folder.__path__.append(sys.argv[1] + "/" + package)  # the examples' files, as if they were in the package

import zen
from harness.bench.patterns import make_gradient
from harness.pipeline import resolve
from tests.cases import CASES
from tests.helpers import check_compressed_sum, check_error_feedback, check_lossless, compare
from zen.compress import compressors
from zen.encodings import encodings
from zen.prediction import layout_and_sets, predict

names = {"schemes": zen.schemes(), "encodings": encodings(), "compressors": compressors()}
for P in (1, 3, 4):
    for case in sorted(CASES):
        check_lossless("example-gather", case, P, torch.float32)
    for case in ("random", "full", "coo", "edges"):
        check_lossless("zen-bp", case, P, torch.float32, pull="example_ids64")
    for kind in ("random", "ties", "sparse"):
        check_compressed_sum("example_stride", "zen", P, kind)
for pattern in ("random", "zipf"):
    tensors = [make_gradient(pattern, 5003, 0.02, r, 4, seed=3) for r in range(4)]
    compare("example-gather", tensors)
    res = zen.simulate("zen-bp", tensors, seed=7, warmup=1, pull="example_ids64")  # past the seed's setup
    layout, sets = layout_and_sets(tensors, 7)
    for r, phases in enumerate(predict("zen-bp", sets, layout, pull="example_ids64")):
        assert {p: v for p, v in phases.items() if v} == {p: v[r] for p, v in res.phases.items() if v[r]}
check_error_feedback("example_stride")
config = resolve(yaml.safe_load(open("workflow/config/default.yaml")))
paper = resolve(yaml.safe_load(open("workflow/config/paper.yaml")))
print(json.dumps({**names, "grid": config["schemes"], "pull": config["bench"]["pull"]["encodings"],
                  "trained": config["train"]["schemes"], "paper_trained": paper["train"]["schemes"],
                  "paper_compressors": paper["train_compressors"]["compressors"],
                  "default_compressors": config.get("train_compressors")}))
"""


def test_one_file_each_joins_the_registries_the_checks_and_the_pipeline(tmp_path: Path) -> None:
    examples = EXAMPLE.findall((ROOT / "docs" / "CONTRIBUTING.md").read_text())
    assert {Path(path).parent.name for path, _ in examples} == {"algorithms", "encodings", "compress"}
    for path, code in examples:
        target = tmp_path / Path(path).parent.name / Path(path).name
        target.parent.mkdir(exist_ok=True)
        target.write_text(code)
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "example-gather" in got["schemes"] and "example-gather" in got["grid"]
    assert "example_ids64" in got["encodings"] and "example_ids64" in got["pull"]
    assert "example_stride" in got["compressors"]
    assert "example-gather" in got["trained"] and "example-gather" in got["paper_trained"]
    assert "example_stride" in got["paper_compressors"] and got["default_compressors"] is None  # not in `make`
