"""`zen cluster`: Fig 15 by model, from a profile's exact bytes, on a cluster of multi-GPU nodes."""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

import pytest

from harness.bench.cluster import Cluster, load_profile, step_time
from zen.cli import main as zen_main
from zen.prediction import predict, totals
from zen.types import WireLayout


@cache
def _profile(root: str) -> Path:
    out = Path(root) / "lstm"
    assert zen_main(["profile", "--workload", "lstm", "--preset", "tiny", "--workers", "8", "--steps", "1",
                     "--rows-from", "ids", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return _profile(str(tmp_path_factory.mktemp("profile")))


def test_one_rank_per_node_is_the_exact_prediction_plus_the_dense_allreduce(profile) -> None:
    params, sets, dense = load_profile(profile)
    cl = Cluster(nodes=4, gpus_per_node=1, uplink_bps=8e9, intra_bps=8e10, local_rate=1e9, alpha_s=0.0)
    got = step_time("zen", params, sets, dense, cl)
    sparse = sum(max(totals(predict("zen", [s.long() for s in per_worker[:4]],
                                    WireLayout(world_size=4, rows=p["rows"], width=p["width"]))))
                 for p, per_worker in zip(params, sets, strict=True))
    ring = 2 * 3 * (dense // 4) * 4  # ring all-reduce: (n-1)/n of the tensor twice, fp32
    assert got["uplink_bytes"] == pytest.approx(sparse + ring, rel=1e-3)
    assert got["intra_s"] == 0.0 and got["local_s"] == pytest.approx(sum(p["rows"] * p["width"] for p in params) / 1e9)
    assert got["comm_s"] == pytest.approx(got["uplink_s"] + got["local_s"])


def test_cli_models_a_multi_gpu_cluster_and_the_emulated_cells(profile, tmp_path, capsys) -> None:
    out = tmp_path / "cluster.csv"
    assert zen_main(["cluster", "--profile", str(profile), "--schemes", "zen,agsparse", "--nodes", "2",
                     "--gpus-per-node", "4", "--emulated", "2,4", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    settings = {r["setting"] for r in rows}
    assert settings == {"model 2x4", "model emulated 2", "model emulated 4"}
    assert {r["scheme"] for r in rows} == {"allreduce", "zen", "agsparse"}  # allreduce: the reference
    by = {(r["setting"], r["scheme"]): r for r in rows}
    assert float(by["model 2x4", "allreduce"]["speedup"]) == 1.0
    assert float(by["model 2x4", "zen"]["intra_s"]) > 0 and float(by["model emulated 2", "zen"]["intra_s"]) == 0
    assert float(by["model 2x4", "zen"]["uplink_bytes"]) < float(by["model 2x4", "allreduce"]["uplink_bytes"])
    assert "speedup over AllReduce" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "4", "--gpus-per-node", "4"], "too few"),
    (["--local-rate", "fast"], "--local-rate"),
    (["--schemes", "nope"], "unknown scheme"),
    (["--bandwidth", "10mbps"], "bad rate"),
])
def test_bad_arguments_are_one_line_and_exit_2(profile, args, message, capsys) -> None:
    assert zen_main(["cluster", "--profile", str(profile), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
