"""`zen train`: every scheme trains like dense allreduce, the JSON report, the hook's bucket split.

Importing this module registers toy workloads (ranks import it through `--plugin`): a model with
three embedding tables (two of one row width, one of another) and a dense parameter between them, on
Zipf-distributed ids; `toy` has dense embedding gradients, `toy-sparse` nn.Embedding(sparse=True), and
`toy-skewed` is `toy` whose rank 0 dawdles in the first scheme's steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import zen
from harness.launch import spawn
from workloads.base import Workload, builtin_workloads, register_workload
from workloads.torch_hooks import NATIVE, NO_COMM
from workloads.train import TrainConfig, rank_main
from zen.algorithms.plans import PLANS
from zen.cli import main as zen_main
from zen.ddp import BucketRouter

from .helpers import FakeBucket

PLUGIN = __name__
ROWS, CLASSES, BAG, BATCH = (500, 300, 200), 4, 6, 16
REAL = tuple(builtin_workloads())  # bert, dlrm, gpt2, lstm and any workload added to the package
TOLERANCE = 1e-4


class Toy(nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.words = nn.Embedding(ROWS[0], 8, sparse=sparse)
        self.tags = nn.Embedding(ROWS[1], 8, sparse=sparse)
        self.scale = nn.Parameter(torch.ones(8))
        self.shapes = nn.Embedding(ROWS[2], 4, sparse=sparse)
        self.hidden = nn.Linear(12, 16)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = (self.words(ids) + self.tags(ids % ROWS[1])).mean(1) * self.scale
        x = torch.cat([x, self.shapes(ids % ROWS[2]).mean(1)], dim=1)
        return self.head(torch.tanh(self.hidden(x)))


def toy_batches(rank: int, world_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed * 7919 + rank * 31 + world_size)
    zipf = 1.0 / torch.arange(1, ROWS[0] + 1, dtype=torch.float64) ** 1.1
    while True:
        ids = torch.multinomial(zipf.expand(BATCH, -1), BAG, replacement=True, generator=gen)
        yield ids, (ids < 3).sum(1).clamp(max=CLASSES - 1)  # how many very frequent ids: learnable


def toy_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = batch
    return F.cross_entropy(model(ids), labels)


DAWDLE_S = 0.5
_FIRST_DDP: list[int] = []  # id of the first DDP model this rank trains (the first scheme's)


def dawdling_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """toy_loss, but rank 0 sleeps DAWDLE_S in each step of the first scheme: its ranks end far apart."""
    if isinstance(model, DistributedDataParallel):
        _FIRST_DDP[:] = _FIRST_DDP or [id(model)]
        if [id(model)] == _FIRST_DDP and torch.distributed.get_rank() == 0:
            time.sleep(DAWDLE_S)
    return toy_loss(model, batch)


def _register(name: str, sparse: bool, loss=toy_loss) -> None:
    def build(preset: str, seed: int) -> Workload:
        return Workload(name, preset, Toy(sparse), toy_batches, loss,
                        ["words.weight", "tags.weight", "shapes.weight"], BATCH, lr=0.5)

    register_workload(name)(build)


_register("toy", sparse=False)
_register("toy-sparse", sparse=True)
_register("toy-skewed", sparse=False, loss=dawdling_loss)


def _train(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "run.json"
    rc = zen_main(["train", "--plugin", PLUGIN, "--out", str(out), *argv])
    assert rc == 0
    return json.loads(out.read_text())


def _max_rel_diff(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


@pytest.mark.parametrize(("world_size", "workload", "extra"), [
    (2, "toy", []),  # dense gradients, one mixed bucket: split by the router
    (3, "toy-sparse", ["--bucket-cap-mb", "0.01"]),  # COO gradients, one bucket per embedding
])
@pytest.mark.slow
def test_every_scheme_matches_allreduce(tmp_path, world_size, workload, extra):
    # DDP's built-in all-reduce only with dense gradients: its all-reduce of COO gradients over gloo corrupts
    # the heap (torch 2.13.0+cpu; see workloads/torch_hooks.py), which aborted this test now and then
    schemes = [*zen.schemes(), NO_COMM] + ([NATIVE] if workload == "toy" else [])
    report = _train(tmp_path, "--workload", workload, "--scheme", ",".join(schemes), "--wandb-mode", "disabled",
                    "--world-size", str(world_size), "--steps", "20", "--warmup", "2", *extra)
    assert report["config"]["world_size"] == world_size and report["config"]["schemes"] == schemes
    assert report["versions"]["torch"] == torch.__version__ and "revision" in report["git"]
    runs = {run["scheme"]: run for run in report["runs"]}
    reference = runs["allreduce"]["steps"]["loss"]
    assert len(reference) == 20 and sum(reference[-5:]) < sum(reference[:5])
    layout = "torch.sparse_coo" if workload == "toy-sparse" else "torch.strided"
    for name in zen.schemes():
        run = runs[name]
        assert _max_rel_diff(run["steps"]["loss"], reference) <= TOLERANCE, name
        assert run["embedding_grad_layout"] == [layout]
        assert all(b > 0 for b in run["steps"]["embedding_bytes_received"]), name
        assert run["summary"]["bytes_received_per_step"] > run["summary"]["embedding_bytes_received_per_step"]
        assert run["summary"]["samples_per_s"] > 0 and run["summary"]["comm_busy_s_median"] > 0
    if workload == "toy":
        assert _max_rel_diff(runs[NATIVE]["steps"]["loss"], reference) <= TOLERANCE
        assert runs[NATIVE]["summary"]["bytes_received_per_step"] is None
    nocomm = runs[NO_COMM]
    assert nocomm["summary"]["bytes_received_per_step"] == 0 and nocomm["summary"]["comm_busy_s_median"] == 0
    assert nocomm["summary"]["samples_per_s"] > 0 and "comm_exposed_s" in runs["zen"]["summary"]
    s = runs["zen"]["summary"]
    assert s["comm_exposed_s_lo"] <= s["comm_exposed_s"] <= s["comm_exposed_s_hi"]
    assert s["samples_per_s"] == pytest.approx(BATCH * world_size / s["iter_s_median"])
    assert set(runs["zen"]["summary"]["zen_choice"].split(",")) <= set(PLANS)  # per part (lanes choose apart)


@pytest.mark.slow
def test_a_scheme_is_not_charged_for_the_previous_schemes_skew(tmp_path):
    """Interleaved, `none`'s rank 0 ends each step DAWDLE_S after the others; every step starts from a
    barrier, so the next scheme's step does not count that wait (a step's time is its slowest rank's)."""
    report = _train(tmp_path, "--workload", "toy-skewed", "--scheme", f"{NO_COMM},allreduce", "--world-size", "2",
                    "--steps", "4", "--warmup", "1", "--wandb-mode", "disabled")
    runs = {run["scheme"]: run["summary"] for run in report["runs"]}
    assert runs[NO_COMM]["iter_s_median"] >= DAWDLE_S
    assert runs["allreduce"]["iter_s_median"] < DAWDLE_S / 2


@pytest.mark.slow
def test_compressed_training_sums_the_same_choice_through_every_sparse_scheme(tmp_path):
    """--compress on the sparse schemes: each sums exactly what the compressors chose, so their loss curves
    agree; allreduce and PyTorch's hooks (fp16, PowerSGD) stay dense and uncompressed."""
    sparse = [s for s in zen.schemes() if s != "allreduce"]
    schemes = [*sparse, "allreduce", "fp16", "powersgd-2"]
    report = _train(tmp_path, "--workload", "toy", "--scheme", ",".join(schemes), "--wandb-mode", "disabled",
                    "--world-size", "2", "--steps", "8", "--warmup", "2", "--compress", "topk", "--density", "0.2")
    assert report["config"]["compress"] == "topk" and report["config"]["density"] == 0.2
    runs = {run["scheme"]: run for run in report["runs"]}
    reference = runs["zen"]["steps"]["loss"]
    for name in sparse:
        assert _max_rel_diff(runs[name]["steps"]["loss"], reference) <= TOLERANCE, name
        assert all(r is not None and r > 0 for r in runs[name]["steps"]["residual_norm"]), name
    assert all(r is None for r in runs["allreduce"]["steps"]["residual_norm"])
    dense = runs["allreduce"]["summary"]["bytes_received_per_step"]
    assert runs["zen"]["summary"]["bytes_received_per_step"] < dense
    for name in ("fp16", "powersgd-2"):
        assert _max_rel_diff(runs[name]["steps"]["loss"], runs["allreduce"]["steps"]["loss"]) < 0.05, name


def test_router_splits_a_bucket_into_embedding_rows_and_dense_runs():
    model = Toy(sparse=False)
    order = [model.head.bias, model.words.weight, model.tags.weight, model.scale, model.shapes.weight,
             model.hidden.weight]
    router = BucketRouter(zen.embedding_params(model))  # found from the nn.Embedding modules
    bucket = FakeBucket(order)
    parts = router.split(bucket)
    assert [(tuple(p.tensor.shape), p.sparse) for p in parts] == [
        ((CLASSES,), False), ((ROWS[0] + ROWS[1], 8), True), ((8,), False), ((ROWS[2], 4), True), ((12 * 16,), False)]
    buffer = bucket.buffer()  # the parts are views of the bucket buffer, covering it in order
    assert all(p.tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for p in parts)
    assert torch.equal(torch.cat([p.tensor.reshape(-1) for p in parts]), buffer)
    flat = BucketRouter(None).split(bucket)  # no embeddings named: the whole bucket through the scheme, flat
    assert len(flat) == 1 and flat[0].sparse and flat[0].tensor is buffer


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "nope"], "unknown workload 'nope'; choose one of: "),
    (["--workload", "toy", "--scheme", "zen,nope"], "unknown scheme nope; choose from: "),
    (["--workload", "toy", "--preset", "huge"], "unknown preset 'huge'"),
    (["--workload", "toy", "--steps", "3", "--warmup", "3"], "must exceed --warmup"),
    (["--workload", "toy", "--compress", "nope"], "unknown compressor 'nope'"),
    (["--workload", "toy", "--compress", "topk", "--density", "2"], "density must be in (0, 1]"),
    (["--workload", "toy", "--compress-option", "seed=1"], "--compress-option needs --compress"),
    (["--workload", "toy", "--compress", "dgc", "--compress-option", "nokey"], "wants KEY=VALUE"),
    (["--workload", "toy", "--scheme", "bf16"], "on gloo use fp16"),
    (["--workload", "toy", "--scheme", "powersgd-0"], "unknown scheme powersgd-0"),
])
def test_bad_arguments_are_reported_before_any_rank_starts(capsys, argv, message):
    assert zen_main(["train", "--plugin", PLUGIN, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "choose" in message:
        assert "toy" in err or "allreduce" in err


TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.is_file(), reason="torchrun not installed beside python")
def test_torchrun_runs_one_rank_per_process_and_logs_to_wandb_offline(tmp_path):
    out = tmp_path / "torchrun.json"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "workloads.train", "--workload", "toy",
           "--plugin", PLUGIN, "--scheme", "zen", "--steps", "4", "--warmup", "1", "--out", str(out)]
    env = {**os.environ, "WANDB_MODE": "offline"}  # the default mode, here through the environment
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        env[var] = str(tmp_path / "home" / var.lower())
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["world_size"] == 2 and report["config"]["backend"] == "gloo"
    assert report["config"]["wandb_mode"] == "offline" and report["config"]["wandb_group"] == "toy-tiny-P2"
    assert len(report["runs"][0]["per_rank"]["loss"]) == 2
    assert list((tmp_path / "wandb").glob("wandb/offline-run-*")), "no offline wandb run next to the JSON"
    assert "wrote" in done.stdout


def rank_many(configs: list[dict]) -> list[dict]:
    """Several trainings in one spawn (process start-up and DDP's first import dominate at tiny sizes)."""
    return [rank_main(config) for config in configs]


@pytest.mark.slow
def test_real_workloads_tiny_zen_matches_allreduce(tmp_path):
    """Every workload of the package in one spawn (the four: about 20-40 s on 2 cores), so not marked slow."""
    configs = [asdict(TrainConfig(workload=w, preset="tiny", schemes=["allreduce", "zen"], steps=5, warmup=1,
                                  out=str(tmp_path / f"{w}.json"), wandb_mode="disabled")) for w in REAL]
    reports = spawn(f"{__name__}:rank_many", 2, {"configs": configs}, timeout_s=600)[0]
    for report in reports:
        runs = {run["scheme"]: run for run in report["runs"]}
        name = report["config"]["workload"]
        assert _max_rel_diff(runs["zen"]["steps"]["loss"], runs["allreduce"]["steps"]["loss"]) <= TOLERANCE, name
        zen_bytes = runs["zen"]["summary"]["embedding_bytes_received_per_step"]
        assert 0 < zen_bytes < runs["allreduce"]["summary"]["embedding_bytes_received_per_step"], name
        assert (tmp_path / f"{name}.json").is_file()


@pytest.mark.slow
def test_training_on_the_emulated_cluster_matches_loopback(tmp_path, netem):
    """--bandwidth runs the same ranks behind shaped links: same losses, bytes, and the config says so. zen-hc:
    its bytes follow from the data alone (zen picks BP or HC per part by measured time, which differs between
    networks, and BP's hash partitions come from a fresh shared seed each launch)."""
    common = ["--workload", "toy", "--scheme", "allreduce,zen-hc", "--wandb-mode", "disabled", "--world-size", "2",
              "--steps", "6", "--warmup", "2"]
    shaped = _train(tmp_path, *common, "--bandwidth", "200mbit")
    (tmp_path / "loop").mkdir()
    loop = _train(tmp_path / "loop", *common)
    assert shaped["config"]["bandwidth"] == "200mbit" and loop["config"]["bandwidth"] is None
    for a, b in zip(shaped["runs"], loop["runs"], strict=True):
        assert a["steps"]["loss"] == b["steps"]["loss"]
        assert a["summary"]["bytes_received_per_step"] == b["summary"]["bytes_received_per_step"]


@pytest.mark.slow
def test_bandwidth_is_refused_under_torchrun_and_checked(capsys, monkeypatch):
    assert zen_main(["train", "--plugin", PLUGIN, "--workload", "toy", "--bandwidth", "fast"]) == 2
    assert "fast" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert zen_main(["train", "--plugin", PLUGIN, "--workload", "toy", "--bandwidth", "1gbit"]) == 2
    assert "torchrun" in capsys.readouterr().err
