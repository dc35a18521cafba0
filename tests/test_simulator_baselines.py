"""The baselines at the paper's setting (simulator.paper, simulator.omnistream, simulator.sparcmerge): SparCML as the
paper ran it and its merges, and OmniReduce's per-block costs (its aggregator's work per block, its columns' round
trips) priced and carried into the step's schedule. No SimGrid needed: these check the schedules the engine is given."""

from __future__ import annotations

import pytest
import torch

from simulator import omnistream, sparcmerge
from simulator.omnistream import BlockCost, block_bytes
from simulator.paper import _sparse_calls, node_shards, variants
from simulator.schedule import Comm, Compute
from simulator.sparcmerge import MergeCost


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


@pytest.mark.parametrize("flag", ["--block-cost", "--merge-cost"])
def test_a_missing_cost_file_is_one_line_and_exit_2(flag: str, tmp_path, capsys) -> None:
    from simulator.cli import main

    (tmp_path / "traces.pt").write_bytes(b"")
    assert main(["paper", "--profile", str(tmp_path), "--workload", "lstm", flag,
                 str(tmp_path / "none.json"), "--csv", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "no such file" in err[0]


def test_paper_without_zen_among_the_schemes_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from simulator.cli import main

    (tmp_path / "traces.pt").write_bytes(b"")
    assert main(["paper", "--profile", str(tmp_path), "--workload", "bert", "--schemes", "omnireduce",
                 "--csv", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "include zen" in err[0] and not (tmp_path / "p.csv").exists()


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


def test_priced_merges_follow_each_exchange_of_a_stream() -> None:
    """SparCML's merge comes after every round's exchange of streams with one partner, for both streams' rows (the
    rank's, sent, and the partner's, received); the counts before the streams, a receive alone (the unfold) and a
    send alone (the fold's sitter) merge nothing."""
    width, row = 8, sparcmerge.INDEX_BYTES + 4 * 8
    rounds = [Comm("all_to_all", "x", {p: 64}, {p: 64}) if k % 2 == 0 else
              Comm("all_to_all", "x", {p: 10 * k * row}, {p: 30 * row}) for p in (1, 2) for k in (0, 1)]
    alone = [Comm("all_to_all", "x", {}, {1: 50 * row}), Comm("all_to_all", "x", {1: 50 * row}, {})]
    got = sparcmerge.priced([*rounds, *alone], MergeCost(2e-9, 1e-9), width)
    assert [i for i in got if isinstance(i, Comm)] == [*rounds, *alone]
    assert [k for k, i in enumerate(got) if isinstance(i, Compute)] == [2, 5]  # after each round's streams
    assert got[2].seconds == pytest.approx(40 * (2e-9 + 8 * 1e-9)) == got[5].seconds


def test_merge_cost_is_measured_and_saved(tmp_path) -> None:
    cost = sparcmerge.measure(rows=4096, repeats=1)
    assert 0 < cost.seconds(1, 64) < 1e-5 and cost.value_s > 0 and "measured here" in cost.source
    cost.save(tmp_path / "m.json")
    assert MergeCost.load(tmp_path / "m.json") == cost


def test_sparcml_merges_reach_every_gpus_schedule_in_the_papers_variant_only() -> None:
    """2 machines x 2 GPUs: with a merge cost, every GPU's embedding call as the paper ran SparCML holds its
    round's merge after the exchange, and the notes say the busiest GPU's merges; the library's own pick
    (another variant) and a call without a cost carry none; per machine it is refused."""
    gen = torch.Generator().manual_seed(4)
    rows, width = 3000, 8
    sets = [torch.randperm(rows, generator=gen)[:200].sort().values for _ in range(4)]
    shards = node_shards(sets, 2, 2, rows)
    size = (2, 2, rows, width)
    paper = {"variant": "ssar_recursive_double"}
    notes: dict[str, dict[str, float]] = {}
    priced = _sparse_calls("sparcml", paper, shards, size, False, 10e-6, None, notes, MergeCost(1e-6, 1e-7))
    merges = [[i.seconds for i in items[2:-1] if isinstance(i, Compute)] for items in priced]
    assert all(len(m) == 1 and m[0] > 0 for m in merges)  # one round between 2 machines
    assert notes["sparcml"]["merge_work_s"] == pytest.approx(max(m[0] for m in merges))
    for options, cost in ((paper, None), ({"variant": "ssar_split_allgather"}, MergeCost(1e-6, 1e-7))):
        bare = _sparse_calls("sparcml", options, shards, size, False, 10e-6, None, None, cost)
        assert all(sum(isinstance(i, Compute) for i in items) == 1 for items in bare)  # the hashing pass only
    with pytest.raises(ValueError, match="per GPU"):
        _sparse_calls("sparcml", paper, shards, size, True, 10e-6, None, None, MergeCost(1e-6, 1e-7))


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
def test_priced_merges_lengthen_sparcmls_step_by_the_critical_paths_merges() -> None:
    """2 machines x 2 GPUs: a merge cost far above the round's link time makes SparCML's step longer by about the
    busiest GPU's merges (each lies between its round and the all-gather that follows); zen's step is unchanged."""
    pytest.importorskip("simgrid", reason="SimGrid's Python module is missing (the simulator's engine)")
    from simulator.paper import scheme_steps

    gen = torch.Generator().manual_seed(6)
    rows = 4000
    sets = [torch.randperm(rows, generator=gen)[:300].sort().values for _ in range(4)]
    steps = {}
    for cost in (None, MergeCost(1e-4, 1e-6)):
        notes: dict[str, dict[str, float]] = {}
        got = scheme_steps("dlrm", sets, rows, 2, 2, [25e9], ["sparcml", "zen"], notes=notes, merge_cost=cost)[25e9]
        steps[cost] = got["sparcml"].step_s, got["zen"].step_s, notes.get("sparcml", {}).get("merge_work_s", 0.0)
    (bare, zen, _), (slow, zen_priced, work) = steps.values()
    assert work > 0.01 and slow > bare + 0.9 * work and zen_priced == pytest.approx(zen, rel=1e-9)
