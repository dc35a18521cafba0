"""The step simulator (simulator/): SimGrid's clock against closed forms, recorded schedules against the bytes
the communicator counted, the platforms, the step's streams, the command line, and the Table 1 presets.

SimGrid is optional: without its Python module the tests that run it skip, and the reason (with how to get it)
shows in pytest's summary (`make test` passes -rs). Where `make setup` can install it (root on Debian/Ubuntu,
as in CI), it must have: test_simgrid_is_installed_where_setup_installs_it fails there otherwise."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from simulator import engine, platform
from simulator.record import counted, part_call, record, record_once
from simulator.schedule import Comm, Compute, Signal, Stream, Wait
from simulator.step import step_streams
from simulator.timeline import Bucket, Param, Timeline
from zen.registry import make_scheme, schemes

try:
    import simgrid  # noqa: F401

    HAVE_SIMGRID = True
except ImportError:
    HAVE_SIMGRID = False
MISSING = ("SimGrid's Python module is missing (the simulator's engine): conda install -c conda-forge simgrid, "
           "or as root on Debian/Ubuntu apt-get install python3-simgrid, then make setup")
needs_simgrid = pytest.mark.skipif(not HAVE_SIMGRID, reason=MISSING)


def test_simgrid_is_installed_where_setup_installs_it() -> None:
    """scripts/setup_simgrid.sh installs SimGrid as root where apt-get is: nothing may skip there."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("not root with apt-get: SimGrid is the user's to install (scripts/setup_simgrid.sh)")
    assert HAVE_SIMGRID, "root with apt-get, yet no SimGrid: run `make setup` (scripts/setup_simgrid.sh)"


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_two_host_transfer_matches_its_closed_form() -> None:
    """One message of S bytes between two namespaces: latency + S / link rate, exactly."""
    size, rate, latency = 50_000_000, 1e9, 3e-4
    p = platform.emulated(2, rate, latency_s=latency)
    streams = [Stream(0, "main", [Comm("all_to_all", "c", sends={1: size})], main=True),
               Stream(1, "main", [Comm("all_to_all", "c", recvs={0: size})], main=True)]
    got = engine.run_step(p, streams)
    assert got.step_s == pytest.approx(latency + 8 * size / rate, rel=1e-9)
    assert got.messages == 1


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_ring_all_reduce_and_shared_cores_match_their_closed_forms() -> None:
    """4 ranks: 1 s of work each on 2 shared cores takes 2 s; then a ring all-reduce of S bytes takes
    2 (P-1)/P S / rate (the formula the emulated links measured 1.00-1.01x of)."""
    size, rate, world = 40_000_000, 1e9, 4
    streams = [Stream(r, "main", [Compute(1.0), Comm("all_reduce", "ar", nbytes=size)], main=True, comm=True)
               for r in range(world)]
    got = engine.run_step(platform.emulated(world, rate, cores=2), streams)
    assert got.step_s == pytest.approx(2.0 + 2 * (world - 1) / world * 8 * size / rate, rel=1e-9)
    assert got.comm_busy_s[0] == pytest.approx(2 * (world - 1) / world * 8 * size / rate, rel=1e-9)


def test_platform_builders() -> None:
    emu = platform.emulated(3, 2.5e9, cores=2)
    assert emu.net_hosts == ("rank0", "rank1", "rank2") and set(emu.cpu_hosts) == {"cpu"}
    assert 'core="2"' in emu.xml and 'radical="0-2"' in emu.xml and 'bw="3.125e+08Bps"' in emu.xml
    flat = platform.gpu_cluster(4, 1, 25e9, 1200e9)
    assert flat.net_hosts == flat.cpu_hosts and flat.world_size == 4 and flat.all_gather == "ring"
    nodes = platform.gpu_cluster(3, 2, 25e9, 1200e9)
    assert nodes.world_size == 6 and nodes.xml.count("<zoneRoute") == 3 * 2 and nodes.xml.count('<link id="nic') == 3


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_nics_are_shared_by_a_machines_gpus() -> None:
    """Two GPUs of machine 0 each send S to machine 1: one NIC carries 2 S; inside a machine NVLink is quick."""
    size, nic = 25_000_000, 25e9
    p = platform.gpu_cluster(2, 2, nic, 1200e9, latency_s=0.0, intra_latency_s=0.0)
    streams = [Stream(0, "m", [Comm("all_to_all", "c", sends={2: size})], main=True),
               Stream(1, "m", [Comm("all_to_all", "c", sends={3: size})], main=True),
               Stream(2, "m", [Comm("all_to_all", "c", recvs={0: size})], main=True),
               Stream(3, "m", [Comm("all_to_all", "c", recvs={1: size})], main=True)]
    assert engine.run_step(p, streams).step_s == pytest.approx(2 * 8 * size / nic, rel=1e-6)


def _tables(world: int, rows: int = 3000, width: int = 8, nnz: int = 120) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(world):
        t = torch.zeros(rows, width)
        ids = torch.randint(0, rows, (nnz,), generator=gen)
        t[ids] = torch.randn(len(ids), width, generator=gen)
        out.append(t)
    return out


@pytest.mark.parametrize("scheme", [*schemes(), None])
def test_recorded_schedule_adds_up_to_the_counted_bytes(scheme: str | None) -> None:
    """Every scheme (None: the dense part's all-reduce) through the recording communicator: per rank, the
    bytes its primitives moved are exactly what the communicator counted (headers and counts included)."""
    world = 4
    tables = _tables(world)
    instances = [make_scheme(scheme) for _ in range(world)] if scheme else None
    items, traffic = record_once(part_call(scheme, tables, world, instances)(), world, "c")
    for r in range(world):
        assert counted(items[r], r, world) == (traffic[r].bytes_sent, traffic[r].bytes_received)
        assert all(isinstance(i, Compute | Comm) for i in items[r])


@pytest.mark.parametrize("world", [1, 3, 4])
def test_a_recorded_call_is_a_step_not_the_communicators_setup(world: int) -> None:
    """A call is recorded on a communicator already set up, as a training step runs: hash partitions take the
    same primitives as equal ranges (their shared seed agreed once, before the step, not in it)."""
    tables = _tables(world)
    kinds = {}
    for scheme in ("zen-bp", "zen-bp-range"):
        items, _ = record_once(part_call(scheme, tables, world, [make_scheme(scheme) for _ in range(world)])(),
                               world, "c")
        kinds[scheme] = [[i.kind for i in rank if isinstance(i, Comm)] for rank in items]
    assert kinds["zen-bp"] == kinds["zen-bp-range"]


@pytest.mark.parametrize("world", [3, 5, 8])
def test_the_predictions_hops_are_the_recorded_schedules(world: int) -> None:
    """zen's prediction (zen.algorithms.plans) charges each plan the link's latency once per hop of its path: an
    exchange with every peer at once is one hop, the fixed all-gather a ring's world - 1 and the dense all-reduce a
    ring's 2 (world - 1) (as the simulated machines and gloo run them). The hops are those of the primitives each
    plan's real code records, at its busiest rank."""
    from simulator.paper import record_cross
    from zen.algorithms import plans
    from zen.types import WireLayout

    rows = 3000
    gen = torch.Generator().manual_seed(3)
    sets = [torch.unique(torch.randint(0, rows, (150,), generator=gen)) for _ in range(world)]
    zen = make_scheme("zen")
    counts = plans.counts_of(sets, WireLayout(world, rows, 4, 4, 4), 0, zen.bp)
    loads = plans.loads(counts, {name: zen.plan(name) for name in plans.PLANS})
    ring = {"all_gather": world - 1, "all_reduce": 2 * (world - 1)}
    for plan in ("bp", "bp-range", "hc", "ag", "allreduce"):
        if plan not in loads:
            continue
        recorded = record_cross("zen", [[s] for s in sets], [rows], 4, choice=plan)[0]
        hops = max(sum(ring.get(i.kind, 1) for i in items) for items in recorded)
        assert loads[plan].hops == hops, plan


def test_engine_expands_collectives_into_the_counted_bytes() -> None:
    """The ring all-reduce and the Bruck / ring all-gathers move, over all ranks, what the counts say."""
    from dataclasses import replace

    for world in (2, 3, 5, 8):
        emu = platform.emulated(world, 1e9)
        for op in (Comm("all_reduce", "a", nbytes=4 * 1001), Comm("all_gather", "g", nbytes=128)):
            for plat in (emu, replace(emu, all_gather="ring"), replace(emu, all_gather="ring", collapse=True)):
                moved = sum(b for r in range(world) for sends, _, _ in engine.rounds(op, r, world, plat)
                            for _, b in sends)
                assert moved == sum(counted([op], r, world)[0] for r in range(world))


def test_the_engines_ring_cuts_chunks_as_the_communicator_does() -> None:
    """simulator.engine.ring_chunk restates zen.comm.base.ring_chunk (its worker never imports zen): the same
    chunk for every size, ring and position."""
    from zen.comm.base import ring_chunk

    for numel in (0, 1, 7, 64, 1001):
        for world in (1, 2, 3, 8, 13):
            assert [engine.ring_chunk(numel, world, r) for r in range(world)] == \
                [ring_chunk(numel, world, r) for r in range(world)], (numel, world)


def test_recording_repeats_keep_the_schedule_and_median_the_work() -> None:
    world = 3
    instances = [make_scheme("zen") for _ in range(world)]
    got = record(part_call("zen", _tables(world), world, instances), world, "c", repeats=3, warmup=2)
    assert [type(i) for i in got[0]][0] is Compute and any(isinstance(i, Comm) for i in got[0])


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_a_hook_step_overlaps_buckets_with_backward() -> None:
    """Two buckets on two lanes: the first bucket's all-reduce runs while backward goes on (hidden), the
    second's after it; `none` is the compute alone."""
    t = Timeline(0.1, 0.4, 0.05, [Bucket(0.1, (Param("a", (1000,), False),)),
                                  Bucket(0.4, (Param("b", (1000,), False),))])
    size = 25_000_000
    calls = {(k, 0): [[Comm("all_reduce", f"b{k}", nbytes=size)] for _ in range(2)] for k in range(2)}
    plat = platform.emulated(2, 1e9, cores=2)
    none = engine.run_step(plat, step_streams("none", 2, t)).step_s
    hook = engine.run_step(plat, step_streams("hook", 2, t, calls)).step_s
    assert none == pytest.approx(0.55, rel=1e-9)
    transfer = 8 * size / 1e9  # a 2-rank ring moves half each way twice: the tensor once
    assert hook == pytest.approx(0.1 + 0.4 + transfer + 0.05, rel=1e-9)


def test_streams_name_their_events_consistently() -> None:
    t = Timeline(0.1, 0.2, 0.0, [Bucket(0.1, (Param("a", (10, 4), True),))])
    streams = step_streams("ddp", 3, t)
    for r in range(3):
        mine = [s for s in streams if s.rank == r]
        signals = {i.event for s in mine for i in s.items if isinstance(i, Signal)}
        waits = {i.event for s in mine for i in s.items if isinstance(i, Wait)}
        assert waits <= signals


def test_cli_bad_arguments_are_one_line_and_exit_2(capsys) -> None:
    from simulator.cli import main

    assert main(["fidelity", "--measured", "nope.json", "--timeline", "t", "--cost", "c", "--csv", "o"]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["calibrate", "--repeats", "0", "--out", "x"]) == 2
    assert main(["fig8", "--profile", ".", "--world-sizes", "1,2", "--csv", "o"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("python -m simulator: error:") for line in err)


def test_a_training_csv_reads_back_as_one_report_per_link_rate(tmp_path, capsys) -> None:
    """`fidelity --measured fig11_throughput.csv --workload W --world-size N`: the cell's rows at each emulated
    rate, compressed and loopback rows left out, the step-time spread from the throughput's."""
    from simulator.cli import main
    from simulator.compare import reports_from_throughput

    head = "workload,preset,scheme,world_size,backend,bandwidth,samples_per_s,samples_per_s_lo,samples_per_s_hi," \
           "iter_ms,comm_ms,compress,density\n"
    rows = ["dlrm,scaled,none,4,gloo,1gbit,100,80,125,100,,,", "dlrm,scaled,zen,4,gloo,1gbit,50,40,60,200,,,",
            "dlrm,scaled,zen,4,gloo,2500mbit,80,70,90,125,,,", "dlrm,scaled,zen,4,gloo,1gbit,60,50,70,150,,dgc,0.05",
            "dlrm,scaled,zen,4,gloo,,90,80,99,110,,,", "dlrm,scaled,zen,2,gloo,1gbit,70,60,80,140,,,",
            "lstm,scaled,zen,4,gloo,1gbit,10,9,11,900,,,"]
    path = tmp_path / "fig11_throughput.csv"
    path.write_text(head + "\n".join(rows) + "\n")
    reports = reports_from_throughput(path, "dlrm", 4)
    assert [r["config"]["bandwidth"] for r in reports] == ["1gbit", "2500mbit"]
    assert all(r["config"]["world_size"] == 4 and r["config"]["workload"] == "dlrm" for r in reports)
    none, zen = reports[0]["runs"]
    assert (none["scheme"], zen["scheme"]) == ("none", "zen") and len(reports[1]["runs"]) == 1
    assert none["summary"] == pytest.approx({"iter_s_median": 0.1, "iter_s_p25": 0.08, "iter_s_p75": 0.125})
    with pytest.raises(ValueError, match="no emulated-cluster cell"):
        reports_from_throughput(path, "bert", 4)
    (tmp_path / "t").write_text("{}")
    (tmp_path / "c").write_text("{}")
    assert main(["fidelity", "--measured", str(path), "--timeline", str(tmp_path / "t"), "--cost",
                 str(tmp_path / "c"), "--csv", str(tmp_path / "o.csv")]) == 2
    assert "needs --workload and --world-size" in capsys.readouterr().err


PAPER_DENSITY = {"lstm": 0.0113, "dlrm": 0.0280, "gpt2": 0.0247, "bert": 0.0106}


@pytest.mark.parametrize("name", ["gpt2", "bert", "dlrm", "lstm"])
def test_table1_presets_are_within_25_percent_of_the_papers_density(name: str) -> None:
    """Per-worker embedding density of the `table1` preset from its batches' ids (4 workers of 128, checked
    against one backward pass), within 25% of Table 1."""
    from workloads.base import build_workload
    from workloads.profile import backward_rows

    w = build_workload(name, "table1", 0)
    assert w.rows is not None
    total = sum(int(p.shape[0]) for n, p in w.model.named_parameters() if n in w.sparse_params)
    densities = []
    for rank in (0, 127):
        batch = next(w.batches(rank, 128, 0))
        rows = w.rows(batch)
        densities.append(sum(r.numel() for r in rows) / total)
        if rank == 0:
            assert all(torch.equal(a.long(), b) for a, b in zip(rows, backward_rows(w, batch), strict=True))
    assert abs(sum(densities) / len(densities) / PAPER_DENSITY[name] - 1) <= 0.25


def _record_coo(scheme: str, ids: list[torch.Tensor], rows: int, width: int, **options: object) -> list[list]:
    """The scheme across len(ids) ranks on COO rows `ids` of a (rows, width) table, recorded (messages only)."""
    from simulator.paper import _record_cross

    shards = [[i] for i in ids]
    return [[i for i in items if isinstance(i, Comm)] for items in _record_cross(scheme, shards, [rows], width, 0,
                                                                                  options)[0]]


@pytest.mark.parametrize("scheme,options", [("agsparse", {}), ("sparse_ps", {}), ("zen", {"choice": "bp"}),
                                            ("zen", {"choice": "hc"}), ("zen", {"choice": "bp-range"}),
                                            ("zen", {"choice": "ag"}), ("omnireduce", {}), ("sparcml", {}),
                                            ("sparcml", {"variant": "ssar_recursive_double"})])
def test_narrow_recordings_extrapolate_to_the_exact_schedule(scheme: str, options: dict) -> None:
    """Where simulator.widths has a plan, the two narrow recordings' line gives, message by message, exactly the
    bytes a recording at the true width moves (here width 48 over 4 ranks; OmniReduce at blocks 256: its plan
    records (3, block 16) and (6, block 32))."""
    from simulator.widths import extrapolate, plan

    gen = torch.Generator().manual_seed(3)
    rows, width = 700, 48
    ids = [torch.randperm(rows, generator=gen)[:90].sort().values for _ in range(4)]
    how = plan(scheme, width, options)
    assert how is not None
    narrow, wider = (_record_coo(scheme, ids, rows, w, **{**options, **o})
                     for w, o in zip(how.widths, how.options, strict=True))
    assert extrapolate(narrow, wider, how.target) == _record_coo(scheme, ids, rows, width, **options)


@pytest.mark.parametrize("variant", ["auto", "ssar_recursive_double"])
def test_sparcml_recorded_narrow_takes_the_wide_problems_dense_switch(variant: str) -> None:
    """Inputs dense enough that SparCML's streams turn dense at width 48 but at other points at width 1: without
    `switch_width` the narrow recordings would choose differently; with it their line is exactly width 48's."""
    from simulator.widths import extrapolate, plan

    gen = torch.Generator().manual_seed(5)
    rows, width = 700, 48
    ids = [torch.randperm(rows, generator=gen)[:k].sort().values for k in (420, 690, 380, 650)]
    exact = _record_coo("sparcml", ids, rows, width, variant=variant)
    assert _record_coo("sparcml", ids, rows, 1, variant=variant) != _record_coo(
        "sparcml", ids, rows, 1, variant=variant, switch_width=width)
    how = plan("sparcml", width, {"variant": variant})
    assert how is not None
    narrow, wider = (_record_coo("sparcml", ids, rows, w, **o) for w, o in zip(how.widths, how.options, strict=True))
    assert extrapolate(narrow, wider, how.target) == exact


def test_width_dependent_schemes_are_recorded_at_their_width() -> None:
    from simulator.widths import plan

    assert plan("sparcml", 1128, {"switch_width": 64}) is None  # told to decide at another width: recorded as is
    assert plan("omnireduce", 958, {}) is None  # gcd(958, 256) = 2: no cheaper exact recording
    assert plan("omnireduce", 1128, {"block_size": 64}) is None
    assert plan("unknown-scheme", 1128, {}) is None  # a new scheme is recorded exactly until shown otherwise


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_collapsed_rings_take_the_time_of_their_steps() -> None:
    """A ring all-reduce on 3 machines x 2 GPUs (two-level) and a ring all-gather among 3 of them: one flow per
    ring plus the steps' latency takes what the step-by-step ring takes."""
    from dataclasses import replace

    plat = platform.gpu_cluster(3, 2, 25e9, 1200e9, latency_s=5e-6)
    streams = [Stream(r, "m", [Comm("all_reduce", "a", nbytes=4 * 300_001),
                               Comm("all_gather", "g", nbytes=4096, group=(1, 3, 5)) if r % 2 else Compute(0.0)],
                      main=True) for r in range(6)]
    collapsed = engine.run_step(plat, streams)
    stepwise = engine.run_step(replace(plat, collapse=False), streams)
    assert collapsed.step_s == pytest.approx(stepwise.step_s, rel=1e-4)  # chunks differ by one element
    assert collapsed.messages < stepwise.messages


@pytest.mark.slow
@needs_simgrid
def test_repeated_launches_of_a_cell_combine_by_their_median(tmp_path) -> None:
    """`fidelity` with three launches of one cell: one row per scheme and link rate, `launches` 3, measured and
    simulated each the median of the launches' own (each launch simulated with its own CPU factor; each call
    records the schemes' local work afresh, so simulated times agree to that timing's noise)."""
    import json
    import statistics
    import subprocess
    import sys

    from simulator.calibrate import MessageCost
    from simulator.compare import fidelity_rows

    timeline = tmp_path / "lstm.json"
    subprocess.run([sys.executable, "-m", "simulator", "timeline", "--workload", "lstm", "--preset", "scaled",
                    "--steps", "2", "--out", str(timeline)], check=True, capture_output=True)
    cost = tmp_path / "cost.json"
    MessageCost(50e-6, 20e-6, 1e-9, "test").save(cost)

    def launch(none_ms: float, allreduce_ms: float) -> dict:
        runs = [{"scheme": s, "summary": {"iter_s_median": ms / 1e3, "iter_s_p25": 0.9 * ms / 1e3,
                                          "iter_s_p75": 1.1 * ms / 1e3}}
                for s, ms in (("none", none_ms), ("allreduce", allreduce_ms))]
        return {"config": {"workload": "lstm", "preset": "scaled", "world_size": 2, "seed": 0, "warmup": 3,
                           "bandwidth": "1gbit"}, "runs": runs}

    launches = [launch(150, 900), launch(160, 1300), launch(140, 880)]
    alone = [{r["scheme"]: r for r in fidelity_rows([rep], timeline, cost)} for rep in launches]
    rows = fidelity_rows(launches, timeline, cost)
    assert [(r["scheme"], r["bandwidth"], r["launches"]) for r in rows] == [("allreduce", "1gbit", 3),
                                                                           ("none", "1gbit", 3)]
    for row in rows:
        one = [a[row["scheme"]] for a in alone]
        for key in ("measured_ms", "measured_ms_lo", "measured_ms_hi", "cpu_factor"):
            assert row[key] == pytest.approx(statistics.median(r[key] for r in one), rel=1e-12), key
        assert row["simulated_ms"] == pytest.approx(statistics.median(r["simulated_ms"] for r in one), rel=0.05)
        assert row["error"] == pytest.approx(row["simulated_ms"] / row["measured_ms"] - 1)
    assert rows[0]["measured_ms"] == pytest.approx(900)  # the 1300 ms launch moves nothing
    json.dumps(rows)  # the CSV's rows are plain numbers


def test_zen_shard_groups_taking_different_partitionings_are_recorded_shard_by_shard() -> None:
    """Where zen's prediction gives a machine's shard groups different BP partitionings (`zen_picks`), each shard's
    messages are those of its own plan: the same as that plan's recording for all shards, on that shard."""
    from simulator.paper import node_shards, plan_label, record_cross, shard_sizes, zen_options

    gen = torch.Generator().manual_seed(3)
    rows, width = 600, 4
    sets = [torch.randperm(rows, generator=gen)[:90].sort().values for _ in range(6)]
    shards, sizes = node_shards(sets, 3, 2, rows), shard_sizes(rows, 2)
    mixed = record_cross("zen", shards, sizes, width, **zen_options(("bp", "bp-range")))
    hashed = record_cross("zen", shards, sizes, width, choice="bp")
    ranged = record_cross("zen", shards, sizes, width, choice="bp-range")
    assert mixed[0] == hashed[0] and mixed[1] == ranged[1] and hashed[1] != ranged[1]
    assert zen_options(("bp", "bp")) == {"choice": "bp"}
    assert plan_label(("bp-range", "bp", "bp-range")) == "bp-range (bp: shards 1)" and plan_label(("hc",)) == "hc"


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_paper_setting_records_each_zen_path_once_and_zen_takes_its_pick() -> None:
    """`simulator paper` on 2 machines x 2 GPUs: zen, zen-bp, zen-bp-range and zen-hc share their recordings (BP
    over hashes or ranges, HC; BP with COO pulls is its own), zen's step is that of the plan the library's
    prediction picks (`zen_picks`), and every scheme's step is at least the compute alone."""
    from simulator.paper import SETTINGS, node_shards, paper_width, scheme_steps, shard_sizes, zen_picks

    gen = torch.Generator().manual_seed(1)
    rows = 4000
    sets = [torch.randperm(rows, generator=gen)[:120].sort().values for _ in range(4)]
    names = ["allreduce", "zen", "zen-bp", "zen-bp-range", "zen-hc", "zen-bp-coo"]
    picked: dict[float, tuple[str, ...]] = {}
    got = scheme_steps("dlrm", sets, rows, 2, 2, [25e9], names, picked=picked)[25e9]
    assert set(got) == {"none", *names}
    assert got["zen-bp-coo"].step_s != got["zen-bp"].step_s  # Fig 17b's COO pulls: recorded apart
    width = paper_width(SETTINGS["dlrm"], rows)
    pick = zen_picks(node_shards(sets, 2, 2, rows), shard_sizes(rows, 2), width, [25e9], 10e-6)[25e9]
    assert len(set(pick)) == 1  # uniform rows: one plan (a mix is recorded shard by shard: the next test)
    assert got["zen"].step_s == got[{"bp": "zen-bp", "bp-range": "zen-bp-range", "hc": "zen-hc"}[pick[0]]].step_s
    assert picked == {25e9: pick}  # what `simulator paper` writes in zen's row (zen_plan)
    assert all(r.step_s >= got["none"].step_s for r in got.values())


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_fig8_simulated_is_never_faster_than_its_bytes_and_scales_the_byte_model(tmp_path) -> None:
    """`simulator fig8` at 3 and 4 GPUs without latency: no scheme beats its busiest rank's bytes over the
    link, AllReduce takes exactly the ring's closed form, and in element units BP's bytes are its byte model's
    (its `predict`, what `zen scale` draws less the input check a recorded step skips) times the width that
    gives Table 1's size."""
    from simulator.fig8 import table
    from zen.prediction import totals
    from zen.types import WireLayout

    gen = torch.Generator().manual_seed(3)
    rows, rate = 3000, 25e9
    sets = [torch.unique(torch.randint(0, rows, (150,), generator=gen)) for _ in range(4)]
    torch.save({"rows": rows, "sets": sets}, tmp_path / "trace.pt")
    names = ["allreduce", "agsparse", "sparcml", "omnireduce", "sparse_ps", "zen-bp", "zen-hc"]
    out = table(tmp_path / "trace.pt", [3, 4], rate, names, latency_s=0.0)
    assert sorted({r["scheme"] for r in out}) == sorted(names) and len(out) == 2 * len(names)
    for r in out:
        n, width = r["world_size"], r["width"]
        assert r["sync_ms"] >= 1e3 * 8 * r["bytes_received_max"] / rate * (1 - 1e-9), r
        if r["scheme"] == "allreduce":
            assert r["sync_ms"] == pytest.approx(1e3 * 8 * 2 * (n - 1) / n * 4 * rows * width / rate, rel=1e-6)
        if r["scheme"] == "zen-bp":
            layout = WireLayout(world_size=n, rows=rows, seed=0)  # a step's own bytes: no input check recorded
            model = max(totals(make_scheme("zen-bp").predict(sets[:n], layout)))
            assert r["bytes_received_max"] == width * model


def test_llm_slices_are_each_tensors_piece_and_the_pattern_counts_blocks() -> None:
    """Tensor parallelism in simulator.llm: GPU j's slice is piece j of every tensor, laid end to end; the union's
    density and the share of blocks it touches are counted per slice."""
    from simulator.llm import TP, pattern, tp_slices

    sizes, chosen = [10, 6], [[torch.tensor([1, 7]), torch.tensor([2, 4])], [torch.tensor([8]), torch.tensor([0])]]
    slice_sizes, slices = tp_slices(sizes, chosen, 2)
    assert slice_sizes == [8, 8]
    assert [s.tolist() for s in slices[0]] == [[1, 7], [2, 6]] and [s.tolist() for s in slices[1]] == [[5], [3]]
    big = [TP * 64]  # one tensor, 64 elements a slice: 4 blocks of 16 each
    union, blocks = pattern(big, [[torch.arange(0, TP * 64, 32)], [torch.arange(1, TP * 64, 32)]], block=16)
    assert union == pytest.approx(2 / 32) and blocks == pytest.approx(0.5)


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_llm_simulated_allreduce_takes_the_nic_bound_and_zen_is_its_faster_path(tmp_path) -> None:
    """`python -m simulator llm` on a synthetic DGC trace (3 workers, two tensors): AllReduce's exposed time is the
    ring's bytes of the machine's 8 slices through its one NIC (the bytes dwarf latency at the LLM's size), no
    step beats compute alone, and zen is the faster of BP and HC."""
    import csv

    from simulator.cli import main
    from simulator.llm import MODELS, TP

    gen = torch.Generator().manual_seed(5)
    sizes = [4000, 2000]
    params = [{"name": f"h.{k}.weight", "rows": n, "width": 1} for k, n in enumerate(sizes)]
    step = [[torch.randperm(n, generator=gen)[: n // 20].sort().values.int() for n in sizes] for _ in range(3)]
    (tmp_path / "p").mkdir()
    torch.save({"params": params, "indices": [step], "losses": [[0.0] * 3]}, tmp_path / "p" / "traces.pt")
    out = tmp_path / "llm.csv"
    assert main(["llm", "--profile", str(tmp_path / "p"), "--nodes", "2,3", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["scheme"] for r in rows} == {"allreduce", "agsparse", "sparcml", "omnireduce", "zen"}
    k = round(MODELS["opt-2.7b"].params / sum(sizes))
    for r in rows:
        n = int(r["nodes"])
        assert float(r["step_ms"]) >= float(r["compute_ms"])
        if r["scheme"] == "zen":
            assert float(r["zen_speedup"]) == 1.0
        if r["scheme"] == "allreduce":
            nic_bytes = 2 * (n - 1) / n * 4 * k * sum(sizes)  # the TP slices of a machine add up to the model
            assert float(r["exposed_comm_ms"]) == pytest.approx(1e3 * 8 * nic_bytes / 25e9, rel=0.02), (r, TP)
    assert main(["llm", "--profile", str(tmp_path / "p"), "--nodes", "4", "--csv", str(out)]) == 2


@pytest.mark.slow  # SimGrid runs in a Python process of its own (simulator.engine)
@needs_simgrid
def test_a_machine_as_one_endpoint_carries_its_gpus_bytes_and_keeps_the_step() -> None:
    """`scheme_steps(per="machine")`: each machine's merged primitives carry exactly the bytes its GPUs' shard groups
    send across machines, and the step stays within a few percent of the per-GPU simulation (AllReduce within
    1%; BP's all-to-all, whose shard groups move together, within 2%)."""
    from simulator.paper import embedding_calls, machine_calls, node_shards, record_cross, scheme_steps, shard_sizes

    gen = torch.Generator().manual_seed(2)
    rows, nodes, gpus, width = 4000, 4, 2, 8
    sets = [torch.randperm(rows, generator=gen)[:200].sort().values for _ in range(nodes * gpus)]
    cross = record_cross("zen", node_shards(sets, nodes, gpus, rows), shard_sizes(rows, gpus), width, choice="bp")
    per_gpu = embedding_calls(cross, nodes, gpus, rows, width)
    per_machine = machine_calls(cross, nodes, gpus, rows, width)
    for m in range(nodes):
        sent = sum(b for g in range(m * gpus, (m + 1) * gpus) for i in per_gpu[g]
                   if isinstance(i, Comm) and i.call not in ("rs", "ag") for b in i.sends.values())
        assert sent == sum(b for i in per_machine[m] if isinstance(i, Comm) for b in i.sends.values()) > 0
    by_gpu = scheme_steps("dlrm", sets, rows, nodes, gpus, [25e9], ["allreduce", "zen-bp"])[25e9]
    by_machine = scheme_steps("dlrm", sets, rows, nodes, gpus, [25e9], ["allreduce", "zen-bp"], per="machine")[25e9]
    assert by_machine["allreduce"].step_s == pytest.approx(by_gpu["allreduce"].step_s, rel=0.01)
    assert by_machine["zen-bp"].step_s == pytest.approx(by_gpu["zen-bp"].step_s, rel=0.02)


@pytest.mark.slow
@needs_simgrid
def test_paper_compute_scale_multiplies_the_roofline_and_a_bad_one_exits_2(tmp_path, capsys) -> None:
    """`--compute-scale`: the compute-only step scales by it exactly (Fig 11's sensitivity rests on that); zero or
    below is one line and exit 2."""
    from simulator.cli import main
    from simulator.paper import scheme_steps

    gen = torch.Generator().manual_seed(1)
    sets = [torch.randperm(4000, generator=gen)[:120].sort().values for _ in range(4)]
    one, two = (scheme_steps("dlrm", sets, 4000, 2, 2, [25e9], ["allreduce"], compute_scale=c)[25e9]
                for c in (1.0, 2.0))
    assert two["none"].step_s == pytest.approx(2 * one["none"].step_s, rel=1e-9)
    assert two["allreduce"].step_s > one["allreduce"].step_s
    (tmp_path / "traces.pt").write_bytes(b"")
    assert main(["paper", "--profile", str(tmp_path), "--workload", "dlrm", "--compute-scale", "0", "--csv",
                 str(tmp_path / "o.csv")]) == 2
    assert capsys.readouterr().err.strip().startswith("python -m simulator: error: --compute-scale must be positive")
