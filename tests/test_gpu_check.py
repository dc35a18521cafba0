"""The parts of the GPU checks that need no GPU (harness.gpucheck: profiler traces, host syncs by thread, rows
beside their negative controls), the scripts' behaviour without CUDA, a GPU per rank under NCCL
(harness.launch.rank_device) and the CUDA build's architecture coverage (zen.native.build).

The traces below are hand-made, in the shape torch.profiler's export_chrome_trace writes (Kineto's JSON:
complete events of category kernel / gpu_memcpy with ts and dur in microseconds, the stream in
args["stream"] and as tid); one test exports a real (CPU-only) trace of the installed torch. The GPU count
and compute capability are faked with monkeypatch (labelled where used): no GPU exists here.
"""

from __future__ import annotations

import inspect
import json
import logging
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import launch
from harness.gpucheck import trace
from harness.gpucheck.syncs import SYNC_MESSAGE, SyncCounter, judge_syncs
from harness.gpucheck.table import FAIL, PASS, CheckFailed, Once, exit_status, render, require, run_row, skipped
from harness.gpucheck.verdicts import judge_hook, judge_race
from zen import native
from zen.native import build

ROOT = Path(__file__).resolve().parents[1]


# ---- profiler traces (hand-made, Kineto's shape) ---------------------------------------------------------------

def _kernel(stream: int, ts: float, dur: float, name: str = "void at::native::gemm<float>(...)",
            cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "context": 1, "stream": stream, "correlation": int(ts)}}


def _trace(*events: dict[str, Any]) -> dict[str, Any]:
    noise = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 0.0, "dur": 5.0,
              "args": {"External id": 1}},
             {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4243, "ts": 1.0,
              "dur": 2.0, "args": {"correlation": 9}},
             {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}}]
    return {"schemaVersion": 1, "traceEvents": noise + list(events)}


def _marked(backward: int, *lanes: int) -> list[dict[str, Any]]:
    """The check's marker kernels: backward's stream first, then each lane's."""
    spin = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    return [_kernel(s, 10.0 + 5 * k, 1.0, spin) for k, s in enumerate((backward, *lanes))]


def test_overlap_of_lanes_with_backward_from_a_trace() -> None:
    got = trace.overlap(_trace(*_marked(7, 20, 24),
                               _kernel(7, 100, 400), _kernel(7, 600, 500),  # backward: 100-500, 600-1100
                               _kernel(20, 300, 400, cat="gpu_memcpy"),  # 300-700: 200 + 100 us alongside
                               _kernel(24, 1000, 300)))  # 1000-1300: 100 us alongside
    assert got.lane_streams == (20, 24)
    assert got.backward_ms == pytest.approx(0.9) and got.lane_ms == pytest.approx(0.7)
    assert got.concurrent_ms == pytest.approx(0.4)
    assert "57%" in trace.judge_overlap(got)


def test_lane_free_and_late_lanes_fail_the_overlap_check() -> None:
    lane_free = trace.overlap(_trace(*_marked(7, 7, 7), _kernel(7, 100, 400), _kernel(7, 500, 300)))
    assert lane_free.lane_streams == () and lane_free.lane_ms == 0
    with pytest.raises(CheckFailed, match="no lane work on a stream of its own"):
        trace.judge_overlap(lane_free)
    late = trace.overlap(_trace(*_marked(7, 20), _kernel(7, 100, 400), _kernel(20, 480, 500)))
    assert late.fraction == pytest.approx(20 / 500)
    with pytest.raises(CheckFailed, match="barely overlaps"):
        trace.judge_overlap(late)


def test_streams_named_only_by_tid_and_traces_that_cannot_be_read() -> None:
    older = {"ph": "X", "cat": "kernel", "name": "spin_kernel", "pid": 0, "tid": "stream 13", "ts": 1, "dur": 1}
    assert [w.stream for w in trace.device_work({"traceEvents": [older]})] == [13]
    with pytest.raises(ValueError, match="names no stream"):
        trace.device_work({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}]})
    with pytest.raises(ValueError, match="no 'spin_kernel' marker"):  # an error of the check, not a failed one
        trace.overlap(_trace(_kernel(7, 100, 400)))


def test_a_real_export_of_the_installed_torch_reads(tmp_path: Path) -> None:
    """torch.profiler's own export (CPU only here: no kernels, so no device work and no markers)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64).mul(2).sum()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    exported = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("cat") == "cpu_op" for e in exported["traceEvents"])
    assert trace.device_work(exported) == []


# ---- host syncs by thread --------------------------------------------------------------------------------------

class FakeBucket:
    """A stand-in for dist.GradBucket (only is_last is read), labelled: the counter never touches the data."""

    def __init__(self, last: bool):
        self.last = last

    def is_last(self) -> bool:
        return self.last


def _sync_warning() -> None:
    warnings.warn(f"called a {SYNC_MESSAGE}", UserWarning, stacklevel=1)


def _on_thread(name: str, fn: Any) -> None:
    t = threading.Thread(target=fn, name=name)
    t.start()
    t.join()


def test_syncs_are_counted_by_the_thread_that_ran_backward_s_hook_calls() -> None:
    counter = SyncCounter()
    hook = counter.wrap(lambda state, bucket: _sync_warning())

    def autograd_device_thread() -> None:  # where DDP calls hooks on a GPU: not the main thread
        hook(None, FakeBucket(last=False))
        hook(None, FakeBucket(last=True))
        _sync_warning()  # backward's own work on that thread, outside a hook call

    with counter.counting():
        _on_thread("pt_autograd_0", autograd_device_thread)
        _on_thread("zen-comm-0", _sync_warning)
        _on_thread("gloo-helper", _sync_warning)
        _sync_warning()  # the main thread (autograd replays its C++ threads' warnings there)
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
    assert dict(counter.counts) == {"hook": 1, "last bucket": 1, "backward": 2, "lane": 1, "gloo-helper": 1}
    with pytest.raises(CheckFailed, match="inside hook calls"):
        judge_syncs(dict(counter.counts))
    assert "on lanes 4" in judge_syncs({"lane": 4, "last bucket": 2, "backward": 1, "buckets": 3})


def test_the_counting_wrapper_is_a_hook_ddp_accepts() -> None:
    """DDP's _check_comm_hook reads the parameter named bucket and rejects string annotations."""
    signature = inspect.signature(SyncCounter().wrap(lambda state, bucket: None))
    assert signature.parameters["bucket"].annotation is inspect.Parameter.empty
    assert signature.return_annotation is inspect.Signature.empty


# ---- rows, controls, verdicts ------------------------------------------------------------------------------------

def _fails() -> str:
    require(False, "wrong sum")
    return ""


def _breaks() -> str:
    raise RuntimeError("rank 1 died")


def test_a_row_passes_only_when_its_check_passes_and_its_control_fails() -> None:
    assert run_row("ok", lambda: "fine", _fails).status == PASS
    assert run_row("no control", lambda: "fine").status == PASS
    blind = run_row("blind", lambda: "fine", lambda: "also fine")
    assert blind.status == FAIL and blind.control.startswith("passed, so the check cannot fail")
    broken = run_row("broken control", lambda: "fine", _breaks)
    assert broken.status == FAIL and broken.control.startswith("broke")
    failed = run_row("failed", _fails, _fails)
    assert failed.status == FAIL and "wrong sum" in failed.detail
    errored = run_row("errored", _breaks)
    assert errored.status == FAIL and "RuntimeError: rank 1 died" in errored.detail
    rows = [blind, skipped("not run", "no kernels")]
    table = render(rows).splitlines()
    assert len(table) == 4 and table[3].startswith("| not run | SKIP |")
    assert exit_status(rows) == 1 and exit_status([rows[1], failed.__class__("x", PASS, "")]) == 0


def test_a_check_and_its_control_read_one_launch() -> None:
    calls = []

    def launch_once() -> dict[str, int]:
        calls.append(1)
        raise RuntimeError("spawn failed")

    shared = Once(launch_once)
    row = run_row("both", lambda: str(shared()), lambda: str(shared()))
    assert len(calls) == 1 and row.status == FAIL and "spawn failed" in row.control


def test_the_race_verdict() -> None:
    probe = {"futures": 4, "wrong": 0, "numel": 1000, "nan": 0, "worst": 1e-8}
    assert "4 bucket results" in judge_race(probe)
    with pytest.raises(CheckFailed, match="700 NaN"):
        judge_race(probe | {"wrong": 800, "nan": 700})
    with pytest.raises(RuntimeError, match="never used"):  # an unused probe proves nothing: not "caught"
        judge_race(probe | {"futures": 0, "wrong": 5})
    row = run_row("race", lambda: judge_race(probe), lambda: judge_race(probe | {"futures": 0, "wrong": 5}))
    assert row.status == FAIL and row.control.startswith("broke")


def test_the_hook_verdict() -> None:
    run = {"losses": [1.0, 0.5], "checksum": 10.0}
    same = {False: {"ddp": run, "zen": run}}
    assert "dense" in judge_hook([same, same])
    other = {False: {"ddp": run, "zen": run | {"checksum": 10.1}}}
    with pytest.raises(CheckFailed, match="parameters differ across ranks"):
        judge_hook([same, other])


# ---- the scripts without CUDA ------------------------------------------------------------------------------------

SCRIPTS = ["gpu_check.py", "nccl_check.py"]


@pytest.fixture(scope="module")
def scripts_run() -> dict[str, subprocess.CompletedProcess]:
    """Both scripts, started at once (they share nothing; each waits mostly on its own imports)."""
    procs = {script: subprocess.Popen([sys.executable, str(ROOT / "scripts" / script)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd="/") for script in SCRIPTS}
    done = {}
    try:
        for script, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[script] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return done


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_exit_2_without_a_gpu(script: str, scripts_run: dict[str, subprocess.CompletedProcess]) -> None:
    done = scripts_run[script]
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "GPU" in done.stderr


def test_a_failed_kernel_build_is_one_failing_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_check

    row = gpu_check.build_row()  # this torch has no CUDA: load_extension("cuda") raises
    assert row.status == FAIL and "no CUDA" in row.detail
    monkeypatch.setattr(gpu_check, "DEVICE_CHECKS", [])  # those run without kernels: not the point here
    rows = gpu_check.device_rows(torch.device("cpu"), built=False)
    assert len(rows) == len(gpu_check.KERNEL_CHECKS) and {r.status for r in rows} == {"SKIP"}


def test_the_rank_bodies_import_and_their_probes_reach_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race probe replaces zen.ddp.hook.result_future and the overlap control each lane's stream.cuda:
    if the hook stops making its Future there, or a lane its stream, this fails here rather than on a GPU."""
    import zen
    import zen.ddp.hook as hook_module
    from zen.device import Stream

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_cases

    assert "result_future(" in inspect.getsource(hook_module.ddp_hook)
    assert hasattr(Stream(torch.device("cpu")), "cuda") and "stream: Stream" in inspect.getsource(hook_module.Lane)
    signature = inspect.signature(gpu_cases._with_host_read(zen.ddp_hook))
    assert signature.parameters["bucket"].annotation is inspect.Parameter.empty
    probe = gpu_cases._LateFuture(None, 1, None)  # a host tensor passes through: the Future's own mechanics
    chained = probe.then(lambda fut: fut.value() + 1)
    probe.set_result(torch.ones(2))
    assert torch.equal(chained.wait(), torch.full((2,), 2.0))


# ---- one GPU per rank under NCCL (device count faked: no GPU here) -----------------------------------------------

def test_rank_device_refuses_two_ranks_on_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # fake: two GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launch.rank_device("nccl") == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)]
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=2 needs a GPU of its own .* sees 2"):
        launch.rank_device("cpu:gloo,cuda:nccl")
    assert launch.rank_device("gloo") is None and len(chosen) == 1  # gloo ranks may share a GPU
    assert launch.rank_device("ncclrules") is None  # the NCCL-rules double moves host tensors


# ---- CUDA architectures (capabilities faked where a GPU is asked for) ---------------------------------------------

@pytest.mark.parametrize(("archs", "capability", "covered"), [
    ("9.0", (9, 0), True), ("8.0", (8, 6), True), ("8.6", (8, 0), False), ("8.0", (9, 0), False),
    ("8.0+PTX", (9, 0), True), ("7.5 8.0", (8, 0), True), ("7.0;7.5", (8, 0), False), ("9.0a", (9, 0), True),
    ("9.0a+PTX", (10, 0), False), ("Hopper", (9, 0), True), ("Ampere", (8, 9), True),
    ("Ampere+Tegra", (8, 6), False), ("native", (12, 0), True), ("", (9, 0), False),
])
def test_arch_coverage(archs: str, capability: tuple[int, int], covered: bool) -> None:
    assert build.arch_covers(archs, capability) is covered


def test_a_build_for_other_gpus_is_reported_once_and_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # fake: a CUDA torch on an H100 (compute 9.0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;8.6")
    monkeypatch.setattr(build, "_build", lambda *a, **k: pytest.fail("built kernels that cannot run here"))
    with pytest.raises(RuntimeError, match=r"cannot run on this machine's GPU\(s\) of compute capability 9.0"):
        build.load_extension("cuda")
    assert not (build.build_dir("cuda") / build.FAILED).exists()  # the same build may fit another machine
    with caplog.at_level(logging.WARNING, logger="zen.native"):
        assert native._load("cuda") is None
    assert sum("unavailable" in r.message for r in caplog.records) == 1
