"""torchrec's DistributedModelParallel with Zen on its data-parallel tables (zen.integrations.torchrec), on two
real gloo ranks and real torchrec: parameters bitwise equal to plain DMP's (tables only, and the dense DDP
too; every table data-parallel, and the largest table-wise), both table kinds, tables of different widths in one
flat weight, bytes per part equal to the prediction from the rows touched, clear refusals, and `zen train
--torchrec`. Everything runs in one spawn: a rank start with torchrec costs seconds."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import zen
from zen.ddp import BucketRouter
from zen.prediction import predict, validation_meta
from zen.types import WireLayout

from .helpers import FakeBucket

P = 2  # bitwise equality with DDP's allreduce needs a sum whose order cannot differ: two ranks
BAGS = {"t0": (120, 8), "t1": (60, 4), "t2": (90, 8)}  # name: (rows, width), as tests/torchrec_cases.py has them
SEQS = {"s0": (80, 4), "s1": (50, 4)}
EBC = [f"ebc.embedding_bags.{n}.weight" for n in BAGS]
EC = [f"ec.embeddings.{n}.weight" for n in SEQS]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from harness.launch import spawn

    out = tmp_path_factory.mktemp("torchrec")
    return spawn("tests.torchrec_cases:everything", P, {"out": str(out)}, timeout_s=900)


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["dp", "mixed"])
def test_parameters_equal_plain_dmp_bit_for_bit(ranks: list[dict], plan: str) -> None:
    assert ranks[0]["tables"] == [BAGS, SEQS]  # the model of the rank bodies (torchrec is imported there only)
    for rank in ranks:
        cell = rank["bitwise"][plan]
        assert set(EBC[1:] + EC) <= set(cell["names"])
        for label in ("zen", "zen+dense"):
            assert cell[label]["differ"] == [], (plan, label)
        assert cell["zen"]["states"] == ["ebc", "ec"] and cell["zen+dense"]["states"] == ["dense", "ebc", "ec"]


@pytest.mark.slow
def test_sparse_params_of_a_sharded_model_are_its_data_parallel_tables(ranks: list[dict]) -> None:
    """zen.embedding_params(dmp): every data-parallel table view, not the table-wise one (its gradient is no
    DDP's), nothing dense."""
    for rank in ranks:
        assert rank["bitwise"]["dp"]["zen"]["tables"] == sorted(EBC + EC)
        assert rank["bitwise"]["mixed"]["zen"]["tables"] == sorted(EBC[1:] + EC)


def _rows(touched: list[list[int]], offset: int = 0) -> list[torch.Tensor]:
    return [torch.tensor(t, dtype=torch.int64) + offset for t in touched]


@pytest.mark.slow
def test_bytes_per_part_are_the_rows_touched(ranks: list[dict]) -> None:
    """Each table of its own width is one part, rows of that width; two neighbouring tables of one width (the
    EmbeddingCollection's) travel as one part over their rows. zen-hc's bytes follow from the row sets alone:
    every part's bytes equal the prediction from the rows each rank's last batch touched."""
    touched = {name: [r["bytes"]["touched"][name] for r in ranks] for name in [*BAGS, *SEQS]}
    s0_rows = SEQS["s0"][0]
    expected = {"ebc": [(_rows(touched[n]), rows, width) for n, (rows, width) in BAGS.items()],
                "ec": [([torch.cat(pair) for pair in zip(_rows(touched["s0"]), _rows(touched["s1"], s0_rows),
                                                         strict=True)], s0_rows + SEQS["s1"][0], 4)]}
    for name, parts in expected.items():
        for i, (sets, rows, width) in enumerate(parts):
            want = predict("zen-hc", sets, WireLayout(P, rows, width))
            for r, rank in enumerate(ranks):
                phases, nnz = rank["bytes"]["parts"][name][i]
                assert nnz == len(sets[r]), (name, i, r)
                assert sum(phases.values()) == sum(want[r].values()) - validation_meta(P), (name, i, r, phases)
                assert sum(phases.values()) < rows * width * 4 / 2  # rows touched, far from the table


@pytest.mark.slow
def test_a_ddp_that_has_a_hook_and_an_unknown_version_are_refused_clearly(ranks: list[dict]) -> None:
    for rank in ranks:
        assert rank["refused_layout"].startswith("TorchrecLayoutError") and "already has a communication hook" \
            in rank["refused_layout"] and "FusedEmbeddingBagCollection" in rank["refused_layout"]
        refused = rank["refused_version"]
        assert refused.startswith("TorchrecLayoutError: zen: torchrec 2.0.0 is not a version") and "_lookups" in refused
        assert rank["accepted_version"] == "accepted"


@pytest.mark.slow
def test_zen_train_torchrec_mode_matches_torchrec_and_counts_the_rows(ranks: list[dict]) -> None:
    """dlrm tiny through DMP (every table data-parallel; the largest table-wise): zen trains exactly as
    torchrec's own wrapping and its bytes per step are the tables' touched rows, not the tables."""
    for report in ranks[0]["dlrm"]:
        runs = {run["scheme"]: run for run in report["runs"]}
        plan = report["config"]["torchrec"]
        assert runs["zen"]["steps"]["loss"] == runs["torchrec"]["steps"]["loss"], plan
        assert runs["torchrec"]["summary"]["bytes_received_per_step"] is None  # torchrec's own: not counted
        table_bytes = 4 * report["config"]["workload_info"]["info"]["embedding_rows"] * 8  # fp32, width 8
        assert 0 < runs["zen"]["summary"]["embedding_bytes_received_per_step"] < table_bytes / 10, plan
        assert runs["none"]["summary"]["bytes_received_per_step"] == 0


@pytest.mark.slow
def test_import_zen_does_not_import_torchrec() -> None:
    code = "import sys, zen, zen.integrations, zen.ddp; assert 'torchrec' not in sys.modules, 'imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_router_cuts_a_flat_weight_at_its_table_views() -> None:
    """torchrec's layout without torchrec: tables of widths 8, 4, 8 as (rows, width) views into one flat weight,
    a dense parameter before it in the bucket, rows nobody named at its end. Each table becomes rows of its own
    width, the gap a dense part; views that overlap or straddle the weight are refused."""
    flat = torch.nn.Parameter(torch.zeros(5 * 8 + 3 * 4 + 2 * 8 + 6))
    views = [flat[:40].view(5, 8), flat[40:52].view(3, 4), flat[52:68].view(2, 8)]
    bias = torch.nn.Parameter(torch.zeros(3))
    parts = BucketRouter(views).split(FakeBucket([bias, flat]))
    assert [(tuple(p.tensor.shape), p.sparse) for p in parts] == [
        ((3,), False), ((5, 8), True), ((3, 4), True), ((2, 8), True), ((6,), False)]
    assert [p.key for p in parts[1:4]] == [(v.data_ptr(),) for v in views]  # one scheme instance per table
    same_width = BucketRouter([flat[:40].view(5, 8), flat[40:56].view(2, 8)]).split(FakeBucket([flat]))
    assert [tuple(p.tensor.shape) for p in same_width] == [(7, 8), (18,)]  # neighbours of one width: one part
    with pytest.raises(zen.ZenInputError, match="overlap"):
        BucketRouter([flat[:40].view(5, 8), flat[32:48].view(2, 8)])
    with pytest.raises(zen.ZenInputError, match="not a run of rows inside"):
        BucketRouter([flat[:40].view(5, 8)]).split(FakeBucket([flat[:20]]))
