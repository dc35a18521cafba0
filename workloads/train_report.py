"""What `zen train` reports: one JSON of every run (config, versions, git revision, per-step records and
their summaries, exposed communication against the no-communication run), the table it prints, and the
wandb runs it logs (offline by default)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness.provenance import git, versions
from workloads.records import STEP_FIELDS, across_ranks, exposed_comm, summarize
from workloads.torch_hooks import NO_COMM
from workloads.train_config import TrainConfig

log = logging.getLogger(__name__)



def report_of(cfg: TrainConfig, runs: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    config = {**asdict(cfg), "device": str(device), "workload_info": runs[0]["workload"]}
    report = {"config": config, "versions": versions(), "git": git(),
              "runs": [_summarize(cfg, run) for run in runs]}
    nocomm = next((r for r in report["runs"] if r["scheme"] == NO_COMM), None)
    for run in report["runs"]:
        if nocomm is not None:
            run["summary"].update(exposed_comm(run, nocomm))
    return report


def _summarize(cfg: TrainConfig, run: dict[str, Any]) -> dict[str, Any]:
    ranks = run["records"]
    steps = across_ranks(ranks)
    samples = run["workload"]["local_batch_size"] * len(ranks)
    summary = summarize(steps, slice(cfg.warmup, None), samples)
    return {"scheme": run["scheme"], "embedding_grad_layout": run["embedding_grad_layout"],
            "summary": summary, "steps": steps,
            "per_rank": {k: [[s[k] for s in r] for r in ranks] for k in ("loss", "iter_s", "bytes_received")}}


def log_wandb(cfg: TrainConfig, report: dict[str, Any]) -> None:
    """Best effort (the JSON already holds everything): a wandb failure, e.g. `online` without a
    network, is logged, not raised."""
    if cfg.wandb_mode == "disabled":
        return
    try:
        _log_wandb(cfg, report)
    except Exception as exc:  # an optional sink must not lose a finished run
        log.warning("wandb logging failed (%s: %s); results are in %s", type(exc).__name__, exc, cfg.out)


def _log_wandb(cfg: TrainConfig, report: dict[str, Any]) -> None:
    """One wandb run per scheme, grouped by `cfg.wandb_group` so schemes line up in one chart;
    files go to <folder of the JSON>/wandb."""
    import wandb

    wandb_dir = Path(cfg.out).parent / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    for run in report["runs"]:
        name = f"{cfg.workload}-{cfg.preset}-{run['scheme']}-P{cfg.world_size}"
        handle = wandb.init(project=cfg.wandb_project, group=cfg.wandb_group, name=name, job_type="train",
                            mode=cfg.wandb_mode, dir=str(wandb_dir),
                            config={**report["config"], "scheme": run["scheme"], "git": report["git"]})
        steps = run["steps"]
        for i, loss in enumerate(steps["loss"]):
            handle.log({k: steps[k][i] for k in STEP_FIELDS if k not in ("loss", "choice") and steps[k][i] is not None}
                       | {"loss": loss}, step=i)
        handle.summary.update({k: v for k, v in run["summary"].items() if v is not None})
        handle.finish()


def print_table(report: dict[str, Any]) -> None:
    """Medians over the timed steps, with the 25th-75th percentile range of the step time."""
    cfg = report["config"]
    squeeze = f", {cfg['compress']} {cfg['density']:g} on the sparse schemes" if cfg.get("compress") else ""
    mode = f", torchrec DMP ({cfg['torchrec']})" if cfg.get("torchrec") else ", FSDP2" if cfg.get("fsdp") else ""
    print(f"{cfg['workload']} ({cfg['preset']}{mode}), {cfg['world_size']} x {cfg['backend']} "
          f"({cfg.get('bandwidth') or 'loopback'}), {cfg['steps']} steps ({cfg['warmup']} warm-up){squeeze}")
    print(f"{'scheme':>13} {'ms/step':>9} {'p25-p75':>15} {'samples/s':>10} {'comm busy':>10} {'exposed':>9} "
          f"{'MB recv/step':>12} {'emb MB':>8} {'final loss':>11} {'residual':>9}")
    for run in report["runs"]:
        s = run["summary"]
        spread = f"{s['iter_s_p25'] * 1e3:.1f}-{s['iter_s_p75'] * 1e3:.1f}"
        residual = s.get("final_residual_norm")
        print(f"{run['scheme']:>13} {s['iter_s_median'] * 1e3:9.2f} {spread:>15} {s['samples_per_s']:10.1f} "
              f"{_ms(s['comm_busy_s_median']):>10} {_ms(s.get('comm_exposed_s')):>9} "
              f"{_mb(s['bytes_received_per_step']):>12} {_mb(s['embedding_bytes_received_per_step']):>8} "
              f"{s['final_loss']:11.6f} {'-' if residual is None else f'{residual:.3g}':>9}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _mb(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.3f}"
