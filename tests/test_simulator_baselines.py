"""The baselines at the paper's setting (simulator.paper, simulator.omnistream): SparCML as the paper ran it, and
OmniReduce's per-block costs (its aggregator's work per block, its columns' round trips) priced and carried into
the step's schedule. No SimGrid needed: these check the schedules the engine is given."""

from __future__ import annotations

import pytest
import torch

from simulator import omnistream
from simulator.omnistream import BlockCost, block_bytes
from simulator.paper import _sparse_calls, node_shards, variants
from simulator.schedule import Comm, Compute


def _peers(items: list) -> set[int]:
    return {p for i in items if isinstance(i, Comm) for p in (*i.sends, *i.recvs)}


def test_paper_setting_runs_sparcml_as_ssar_recursive_double() -> None:
    """At the paper's setting `sparcml` is the paper's SSAR_Recursive_double: on 8 ranks each talks to its
    3 recursive-doubling partners only, on inputs where the library's own pick (`sparcml-auto`) splits the
    range and reaches every rank."""
    from simulator.fig8 import sync_calls

    assert variants("sparcml") == [("sparcml", {"variant": "ssar_recursive_double"})]
    assert variants("sparcml-auto") == [("sparcml", {})]
    gen = torch.Generator().manual_seed(2)
    rows = 20_000
    sets = [torch.randperm(rows, generator=gen)[:4000].sort().values for _ in range(8)]
    (scheme, options), = variants("sparcml")
    paper = sync_calls(scheme, options, sets, rows, 4, "row")
    assert [_peers(paper[r]) for r in range(8)] == [{r ^ 1, r ^ 2, r ^ 4} for r in range(8)]
    (scheme, options), = variants("sparcml-auto")
    auto = sync_calls(scheme, options, sets, rows, 4, "row")
    assert _peers(auto[0]) == set(range(1, 8))


def _omni_items(pushed: dict[int, int], served: int) -> list:
    """A rank's OmniReduce call as recorded: a header round, the push (blocks from each worker), the pull (the
    union blocks it serves to each peer)."""
    head = Comm("all_to_all", "x", {p: 16 for p in pushed}, {p: 16 for p in pushed})
    push = Comm("all_to_all", "x", {p: 2 * block_bytes() + 4 for p in pushed},
                {p: k * block_bytes() + 4 for p, k in pushed.items()})
    pull = Comm("all_gather_bytes", "x", {p: served * block_bytes() + 4 for p in pushed}, {p: 8 for p in pushed})
    return [head, Compute(0.001), push, pull]


def test_priced_charges_each_aggregator_the_blocks_pushed_to_it() -> None:
    """The aggregator's work goes on the push, for the blocks it received (5 + 2 here, not the 2 + 2 it sent),
    shared by OmniReduce's 8 threads; nothing else in the call changes."""
    items = _omni_items({1: 5, 2: 2}, served=9)
    got = omnistream.priced(items, BlockCost(8e-6))
    assert got[2].cpu_s == pytest.approx(7 * 8e-6 / omnistream.AGGREGATOR_THREADS)
    assert [g for k, g in enumerate(got) if k != 2] == [i for k, i in enumerate(items) if k != 2]
    assert omnistream.push_blocks(items) == 7 and omnistream.union_blocks(items) == 9
    assert omnistream.block_messages(items) == 2 + 2 + 7 + 2 * 9  # sent and received, push and pull


def test_round_trip_floor_counts_whole_rounds_of_columns() -> None:
    """A column advances one block per round trip and 64 are in flight: 64 union blocks take one round trip,
    65 take two, 130 take three."""
    for served, trips in ((64, 1), (65, 2), (130, 3)):
        assert omnistream.round_trip_floor(_omni_items({1: 1}, served), 10e-6) == pytest.approx(trips * 20e-6)


def test_block_cost_is_measured_and_saved(tmp_path) -> None:
    cost = omnistream.measure(workers=2, blocks=64, repeats=1)
    assert 0 < cost.aggregate_s < 1e-3 and "measured here" in cost.source
    cost.save(tmp_path / "b.json")
    assert BlockCost.load(tmp_path / "b.json") == cost


def test_omnireduce_block_costs_reach_every_gpus_schedule() -> None:
    """2 machines x 2 GPUs: with a block cost, every GPU's embedding call carries its aggregator work into the
    cross-machine push (through the shard groups' renumbering), and the notes say the busiest aggregator's work
    and floor; without one, nothing is priced."""
    gen = torch.Generator().manual_seed(4)
    rows, width = 3000, 8
    sets = [torch.randperm(rows, generator=gen)[:200].sort().values for _ in range(4)]
    shards = node_shards(sets, 2, 2, rows)
    notes: dict[str, dict[str, float]] = {}
    priced = _sparse_calls("omnireduce", {}, shards, (2, 2, rows, width), False, 10e-6, BlockCost(1e-6), notes)
    work = [sum(i.cpu_s for i in items if isinstance(i, Comm)) for items in priced]
    assert all(w > 0 for w in work)
    assert notes["omnireduce"]["aggregator_work_s"] == pytest.approx(max(work))
    assert notes["omnireduce"]["round_trip_floor_s"] >= 20e-6 and notes["omnireduce"]["block_messages"] > 0
    bare = _sparse_calls("omnireduce", {}, shards, (2, 2, rows, width), False, 10e-6, None, None)
    assert all(i.cpu_s == 0 for items in bare for i in items if isinstance(i, Comm))


def test_a_missing_block_cost_file_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from simulator.cli import main

    (tmp_path / "traces.pt").write_bytes(b"")
    assert main(["paper", "--profile", str(tmp_path), "--workload", "lstm", "--block-cost",
                 str(tmp_path / "none.json"), "--csv", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--block-cost" in err[0] and "no such file" in err[0]


def test_a_tcp_block_message_is_timed_and_bad_arguments_are_one_line(capsys) -> None:
    """harness.bench.block_messages: every message sent and received over loopback (the run ends), a positive
    cost each; a bad count is one line and exit 2."""
    from harness.bench.block_messages import main, one_run

    cpu, wall = one_run(2000, 1028)
    assert 0 < cpu < 1e-3 and 0 < wall < 1e-2
    with pytest.raises(SystemExit) as exit_:
        main(["--count", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--count" in err[0]


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
def test_a_priced_block_cost_lengthens_omnireduces_step_once_it_outlasts_the_push() -> None:
    """2 machines x 2 GPUs: a block cost far above the push's link time makes OmniReduce's step longer by about
    the busiest aggregator's work; the measured-size cost that hides behind the transfers leaves it as it was."""
    pytest.importorskip("simgrid", reason="SimGrid's Python module is missing (the simulator's engine)")
    from simulator.paper import scheme_steps

    gen = torch.Generator().manual_seed(6)
    rows = 4000
    sets = [torch.randperm(rows, generator=gen)[:300].sort().values for _ in range(4)]
    steps = {}
    for cost in (None, BlockCost(1e-9), BlockCost(1e-3)):
        notes: dict[str, dict[str, float]] = {}
        got = scheme_steps("dlrm", sets, rows, 2, 2, [25e9], ["omnireduce"], block_cost=cost, notes=notes)[25e9]
        steps[cost] = got["omnireduce"].step_s, notes.get("omnireduce", {}).get("aggregator_work_s", 0.0)
    bare = steps[None][0]
    assert steps[BlockCost(1e-9)][0] == pytest.approx(bare, rel=1e-6)
    slow, work = steps[BlockCost(1e-3)]
    assert work > 0.01 and slow > bare + 0.5 * work
