"""zen.fsdp on real FSDP2 ranks (gloo, CPU): parameters after N steps equal FSDP's own reduce-scatter's, the bytes
each call sends are the rows its input holds (or the dense chunk where cheaper), compression and bad input."""

from __future__ import annotations

import pytest

from harness.launch import spawn

from .helpers import BF16_BOUND, FP32_BOUND, FSDP_SHAPES, assert_params_equal

pytestmark = pytest.mark.slow


def _run(world: int, cases: list[dict]) -> list[list[dict]]:
    return spawn("tests.fsdp_cases:cases", world, {"cases": cases}, timeout_s=600)


@pytest.mark.parametrize("world", [2, 4])
def test_parameters_match_fsdp_default(world: int) -> None:
    """The owner adds the ranks' chunks in rank order (a zero row adds nothing, exactly) and divides by P: bitwise
    FSDP's own on 2 ranks, within FP32_BOUND / BF16_BOUND on 4 (another summation order)."""
    cases = []
    for shape in FSDP_SHAPES.values():
        cases += [{"scheme": s, **shape} for s in ("fsdp", "zen", "dense")]
        cases.append({"scheme": "zen", "gather": "delta", **shape})  # after the dense "zen" case: its reference
    cases += [{"scheme": s, "reduce_dtype": "bfloat16", **FSDP_SHAPES["padded"]} for s in ("fsdp", "zen")]
    per_rank = _run(world, cases)
    for results in per_rank:
        for i in range(len(cases)):
            if cases[i]["scheme"] == "fsdp":
                ref = results[i]["params"]
                continue
            bf16 = cases[i].get("reduce_dtype") == "bfloat16"
            bound = 0.0 if world == 2 else BF16_BOUND if bf16 else FP32_BOUND
            assert_params_equal(ref, results[i]["params"], bound, str(cases[i]))
            if cases[i].get("gather"):  # the changed rows' all-gather gives FSDP's bits: the same run as "zen"
                assert_params_equal(results[i - 1]["params"], results[i]["params"], 0.0, f"{cases[i]} vs zen")
            for call in results[i]["calls"]:
                assert call["sent"] == call["expected"], (cases[i], call)
    for i in range(len(cases)):  # identical on every rank
        assert_params_equal(per_rank[0][i]["params"], per_rank[-1][i]["params"], 0.0, "rank 0 vs last")


def test_bytes_are_rows_and_dense_groups_fall_back() -> None:
    """An embedding touched on a few rows sends rows (well under its dense chunks); the dense head's group, with no
    zero rows, goes dense to every peer in the same single round (the header rides in front: meta is one header a
    peer)."""
    shape = {"rows": 4000, "width": 16, "used": 40}
    zen_run = _run(4, [{"scheme": "zen", **shape}, {"scheme": "zen", "gather": "delta", **shape}])[0]
    calls = zen_run[0]["calls"]
    emb = [c for c in calls if c["choice"] == "rows"]
    head = [c for c in calls if c["choice"] == "dense"]
    dense_chunks = 3 * (4000 // 4) * 16 * 4
    assert emb and head
    assert all(c["sent"] <= dense_chunks / 10 for c in emb), emb
    assert all(c["sent"] == c["expected"] and c["meta"] == 3 * 64 for c in calls), calls
    # the parameters' all-gathers of the last step: the embedding's changed rows, not one dense shard of it
    assert 0 < zen_run[1]["gather_sent"] < dense_chunks, zen_run[1]["gather_sent"]


def test_dgc_sends_its_choice_and_trains_alike_dense_or_rows() -> None:
    """With DGC every group is compressed (error feedback per rank and group): rows or dense, the ranks sum the
    same chosen values, so the parameters agree bitwise; rows cost the chosen elements only."""
    shape = {"rows": 300, "width": 8, "used": 300, "steps": 5}
    runs = _run(2, [{"scheme": s, "compress": "dgc", **shape} for s in ("zen", "dense")])
    for zen_run, dense_run in runs:
        assert_params_equal(dense_run["params"], zen_run["params"], 0.0, "dgc zen vs dense")
        assert all(c["sent"] == c["expected"] for c in zen_run["calls"]), zen_run["calls"]
        assert set(zen_run["residuals"]) == {"<root>"} and zen_run["residuals"]["<root>"] > 0  # error feedback kept
        head = [c for c in zen_run["calls"] if c["dense_bytes"] < 3000]  # the head's group: 3 x 8 + 3 elements
        assert all(c["choice"] == "rows" and c["sent"] < c["dense_bytes"] for c in head), head


def test_group_of_another_mesh_is_refused_on_every_rank() -> None:
    per_rank = spawn("tests.fsdp_cases:refusals", 2, {}, timeout_s=300)
    out, bad = [got["other_mesh"] for got in per_rank], [got["bad_scheme"] for got in per_rank]
    assert all("another mesh" in msg for msg in out), out
    assert all("unknown scheme 'allreduce'" in msg for msg in bad), bad


def test_zen_train_fsdp_writes_the_ddp_json(tmp_path, monkeypatch) -> None:
    """`zen train --fsdp`: FSDP's own reduce-scatter, zen and zen-delta side by side in one launch, the DDP runs'
    JSON; on 2 ranks the same losses (the sums are bitwise FSDP's), the zen schemes' bytes counted, zen-delta's
    all-gathers among them."""
    import json

    from workloads.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "fsdp.json"
    assert main(["--fsdp", "--workload", "gpt2", "--preset", "tiny", "--world-size", "2", "--steps", "3",
                 "--warmup", "1", "--scheme", "fsdp,zen,zen-delta", "--out", str(out)]) == 0
    runs = {r["scheme"]: r["summary"] for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"fsdp", "zen", "zen-delta"}
    assert runs["fsdp"]["final_loss"] == runs["zen"]["final_loss"] == runs["zen-delta"]["final_loss"], runs
    assert runs["fsdp"]["bytes_received_per_step"] is None
    assert 0 < runs["zen"]["bytes_received_per_step"] < runs["zen-delta"]["bytes_received_per_step"], runs
