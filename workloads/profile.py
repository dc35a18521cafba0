"""`zen profile`: record the embedding-gradient sparsity of a workload (Zen Table 1, Fig 2, Fig 3).

N data-parallel workers are emulated one after the other in this process: at every step each
worker runs a real forward/backward pass on its own batch, the non-zero rows of its sparse
(embedding) gradients are recorded, and (unless --no-update) the model takes an SGD step with the
workers' averaged gradient, as data-parallel training would. The statistics (workloads/sparsity.py)
use one row space per workload: its sparse parameters stacked in `sparse_params` order.

Outputs in --out (each written atomically): profile.json (summary), workers.csv (per step and
worker), union.csv (d_G^n and gamma^n per step), overlap.csv (pairwise overlap per step) and
traces.pt (int32 row ids per step, worker and parameter, for replay in simulations).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.provenance import atomic_file, write_atomic, write_csv
from workloads import sparsity
from workloads.base import PRESETS, Workload, build_workload, reads_text, workload_names
from workloads.corpora import CORPORA, DOCUMENT_CORPORA, CorpusChoiceError
from workloads.train_args import add_compress_arguments, parse_compress_options, with_defaults
from zen.cli_args import UsageError
from zen.compress import Compressor, PartContext, make_compressor

log = logging.getLogger(__name__)
SKEW_PARTS = (8, 128)
SHARE_PARTS = 8
ROW_SOURCES = ("backward", "ids")


@dataclass
class Trace:
    """Row ids of every worker's sparse gradients, per step: indices[step][worker][param]."""

    params: list[dict[str, Any]]  # name, rows, width of each sparse parameter
    indices: list[list[list[torch.Tensor]]]
    losses: list[list[float]]  # losses[step][worker]

    def stacked(self, step: int, worker: int) -> torch.Tensor:
        """The worker's row ids in the stacked row space of all sparse parameters."""
        offsets = torch.tensor([0] + [p["rows"] for p in self.params[:-1]]).cumsum(0).tolist()
        ids = self.indices[step][worker]
        return torch.cat([idx.long() + off for idx, off in zip(ids, offsets, strict=True)])

    @property
    def num_rows(self) -> int:
        return sum(p["rows"] for p in self.params)


def record(workload: Workload, workers: int, steps: int, seed: int, update: bool = True,
           compressor: Callable[[], Compressor] | None = None) -> Trace:
    """Run `steps` emulated data-parallel steps of `workers` workers and record their index sets: the non-zero
    rows of the sparse (embedding) gradients; or, with `compressor` (a factory), the elements each worker's own
    compressor (its own residuals) chooses from every tensor's gradient, each tensor a part (DGC's layer-wise
    top-k; the paper's LLM runs apply it to every bucket), every parameter then a "sparse parameter" of width-1
    rows, and the model steps on the chosen gradients, as data-parallel training with the compressor would."""
    model = workload.model
    named = dict(model.named_parameters())
    squeezers = [compressor() for _ in range(workers)] if compressor else None
    traced = [n for n, p in named.items() if p.requires_grad] if squeezers else list(workload.sparse_params)
    streams = [workload.batches(w, workers, seed) for w in range(workers)]
    opt = torch.optim.SGD(model.parameters(), lr=workload.lr)
    params = [{"name": n, "rows": named[n].numel(), "width": 1} for n in traced] if squeezers else _params(workload)
    trace = Trace(params, [], [])
    for step in range(steps):
        summed: dict[str, torch.Tensor] = {}
        trace.indices.append([])
        trace.losses.append([])
        for w in range(workers):
            model.zero_grad(set_to_none=True)
            loss = workload.loss(model, next(streams[w]))
            loss.backward()
            trace.losses[-1].append(loss.item())
            if squeezers:
                trace.indices[-1].append([_chosen(squeezers[w], n, named[n], k, step, workers)
                                          for k, n in enumerate(traced)])
            else:
                trace.indices[-1].append([sparsity.nonzero_rows(named[n].grad).int() for n in traced])
            if update:
                for n, p in named.items():
                    if p.grad is not None:
                        summed[n] = summed[n].add_(p.grad) if n in summed else p.grad.clone()
        if update:
            for n, p in named.items():
                p.grad = summed[n].div_(workers) if n in summed else None
            opt.step()
        log.info("step %d: loss %.4f", step, statistics.fmean(trace.losses[-1]))
    return trace


def _chosen(squeezer: Compressor, name: str, p: torch.Tensor, tag: int, step: int, workers: int) -> torch.Tensor:
    """The ids `squeezer` chooses from p's gradient, which becomes the chosen gradient (zeros elsewhere)."""
    flat = p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())  # compressed in place
    ids = squeezer.compress(flat, PartContext(name, tag, step, workers)).indices.int()
    p.grad = flat.view_as(p)
    return ids


def record_ids(workload: Workload, workers: int, steps: int, seed: int) -> Trace:
    """The same index sets from the batches' ids alone (`Workload.rows`): no forward or backward, so 128
    workers take seconds. The batches do not depend on the model, so this equals `record`'s sets; the
    first worker's first step and the last worker's last step are checked against backward (`backward_rows`)."""
    if workload.rows is None:
        raise ValueError(f"workload {workload.name!r} does not give its rows from batch ids (Workload.rows)")
    streams = [workload.batches(w, workers, seed) for w in range(workers)]
    trace = Trace(_params(workload), [], [])
    checked = {(0, 0), (steps - 1, workers - 1)}
    for step in range(steps):
        trace.indices.append([])
        trace.losses.append([])
        for w in range(workers):
            batch = next(streams[w])
            rows = [r.int() for r in workload.rows(batch)]
            if (step, w) in checked:
                touched = backward_rows(workload, batch)
                if not all(torch.equal(a.long(), b) for a, b in zip(rows, touched, strict=True)):
                    raise RuntimeError(f"{workload.name}: the rows of worker {w}'s batch at step {step} differ "
                                       f"from the rows its backward touches")
            trace.indices[-1].append(rows)
        log.info("step %d: %d workers' rows from their batches", step, workers)
    return trace


def backward_rows(workload: Workload, batch: Any) -> list[torch.Tensor]:
    """The non-zero rows of every sparse parameter's gradient after one backward pass on `batch`."""
    named = dict(workload.model.named_parameters())
    workload.model.zero_grad(set_to_none=True)
    workload.loss(workload.model, batch).backward()
    rows = [sparsity.nonzero_rows(named[n].grad) for n in workload.sparse_params]
    workload.model.zero_grad(set_to_none=True)
    return rows


def _params(workload: Workload) -> list[dict[str, Any]]:
    named = dict(workload.model.named_parameters())
    return [{"name": n, "rows": named[n].shape[0], "width": named[n][0].numel()} for n in workload.sparse_params]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def step_rows(trace: Trace, step: int) -> tuple[list[dict], list[dict], list[dict]]:
    """CSV rows of one step: per worker, per union size n, per worker pair."""
    m = trace.num_rows
    sets = [trace.stacked(step, w) for w in range(len(trace.indices[step]))]
    workers = []
    losses = trace.losses[step]  # none when the rows came from batch ids
    for w, s in enumerate(sets):
        row = {"step": step, "worker": w, "nnz": s.numel(), "density": sparsity.density(s, m),
               "loss": losses[w] if losses else float("nan")}
        row.update({f"skew{p}": sparsity.skewness(s, m, p) for p in SKEW_PARTS})
        row.update({f"share{j}": v for j, v in enumerate(sparsity.partition_shares(s, m, SHARE_PARTS))})
        workers.append(row)
    unions = [{"step": step, "n": n, "density": d, "gamma": g}
              for n, (d, g) in sparsity.densification(sets, m).items()]
    pairs = [{"step": step, "i": i, "j": j, "overlap": r} for (i, j), r in sparsity.overlaps(sets, m).items()]
    return workers, unions, pairs


def summarize(trace: Trace, workers: list[dict], unions: list[dict], pairs: list[dict]) -> dict[str, Any]:
    """Means over steps (and workers) of the per-step statistics: Table 1, Fig 2a/2b, Fig 3a/3b."""
    n_workers, n_steps, m = len(trace.indices[0]), len(trace.indices), trace.num_rows

    def mean_of(rows: list[dict], key: str, **match: int) -> float:
        return _mean([r[key] for r in rows if all(r[k] == v for k, v in match.items())])

    pair_overlaps: dict[tuple[int, int], list[float]] = {}  # one pass: 128 workers have 8,128 pairs a step
    for r in pairs:
        pair_overlaps.setdefault((r["i"], r["j"]), []).append(r["overlap"])

    full_union = [sparsity.union([trace.stacked(s, w) for w in range(n_workers)], m) for s in range(n_steps)]
    per_param = [_mean([sparsity.density(trace.indices[s][w][k], p["rows"])
                        for s in range(n_steps) for w in range(n_workers)])
                 for k, p in enumerate(trace.params)]
    ns = sorted({r["n"] for r in unions})
    overlaps = [r["overlap"] for r in pairs]
    return {
        "num_rows": m,
        "params": [{**p, "density": d} for p, d in zip(trace.params, per_param, strict=True)],
        "density": {"mean": mean_of(workers, "density"),
                    "per_worker": [mean_of(workers, "density", worker=w) for w in range(n_workers)]},
        "union": {"n": ns, "density": [mean_of(unions, "density", n=n) for n in ns],
                  "gamma": [mean_of(unions, "gamma", n=n) for n in ns]},
        "overlap": {"mean": _mean(overlaps), "min": min(overlaps, default=0.0),
                    "max": max(overlaps, default=0.0),
                    "matrix": [[1.0 if i == j else _mean(pair_overlaps[min(i, j), max(i, j)])
                                for j in range(n_workers)] for i in range(n_workers)]},
        "skewness": {str(p): mean_of(workers, f"skew{p}") for p in SKEW_PARTS}
        | {f"union_{p}": _mean([sparsity.skewness(u, m, p) for u in full_union]) for p in SKEW_PARTS},
        "partition_share": [mean_of(workers, f"share{j}") for j in range(SHARE_PARTS)],
        "union_partition_share": [_mean([sparsity.partition_shares(u, m, SHARE_PARTS)[j] for u in full_union])
                                  for j in range(SHARE_PARTS)],
        "loss": [_mean(step_losses) for step_losses in trace.losses if step_losses],  # none from ids
    }


def write_outputs(out: Path, summary: dict[str, Any], tables: dict[str, list[dict]], trace: Trace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        write_csv(out / f"{name}.csv", rows)
    payload = {"params": trace.params, "indices": trace.indices, "losses": trace.losses}
    with atomic_file(out / "traces.pt") as tmp:
        torch.save(payload, tmp)
    text = json.dumps(summary, indent=1) + "\n"
    write_atomic(out / "profile.json", text)


def profile(name: str, preset: str, workers: int, steps: int, seed: int, out: Path,
            update: bool = True, rows_from: str = "backward", compress: dict[str, Any] | None = None,
            corpora: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Build, record (`rows_from`: "backward" or "ids"; `compress`: make_compressor's arguments, the elements a
    sparsifier chooses; `corpora`: a text workload's text in place of its preset's), summarize and write; returns
    the summary (also in out/profile.json)."""
    t0 = time.perf_counter()
    workload = build_workload(name, preset, seed, corpora)
    torch.manual_seed(seed)  # the training randomness (dropout's masks): the same trace on every run
    if compress is not None:
        trace = record(workload, workers, steps, seed, update, lambda: make_compressor(**compress))
    elif rows_from == "ids":
        trace, update = record_ids(workload, workers, steps, seed), False
    else:
        trace = record(workload, workers, steps, seed, update)
    tables: dict[str, list[dict]] = {"workers": [], "union": [], "overlap": []}
    for step in range(steps):
        for key, rows in zip(tables, step_rows(trace, step), strict=True):
            tables[key].extend(rows)
    summary = {"workload": name, "preset": preset, "workers": workers, "steps": steps, "seed": seed,
               "update": update, "rows_from": "compressor" if compress else rows_from, "compress": compress,
               "local_batch_size": workload.local_batch_size,
               "lr": workload.lr, "info": workload.info,
               "dense_numel": sum(p.numel() for n, p in workload.model.named_parameters()
                                  if n not in workload.sparse_params),
               **summarize(trace, *tables.values()),
               "seconds": time.perf_counter() - t0,
               "files": ["profile.json", "workers.csv", "union.csv", "overlap.csv", "traces.pt"]}
    write_outputs(out, summary, tables, trace)
    return summary


def corpus_list(text: str) -> tuple[str, ...]:
    """--corpora's value: known corpus names, comma-separated, none twice."""
    names = tuple(text.split(","))
    unknown = [c for c in names if c not in CORPORA]
    if unknown or len(set(names)) != len(names) or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct corpora from {', '.join(CORPORA)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, choices=workload_names())
    parser.add_argument("--preset", default="small", choices=PRESETS)
    parser.add_argument("--workers", type=int, default=8, help="emulated data-parallel workers")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--no-update", dest="update", action="store_false",
                        help="keep the model fixed (no SGD step between steps)")
    parser.add_argument("--rows-from", choices=ROW_SOURCES, default="backward",
                        help="backward: run every worker's backward pass; ids: the rows its batch looks up (no "
                             "model run, so hundreds of workers take seconds; two steps are checked against "
                             "backward; the model stays fixed)")
    parser.add_argument("--corpora", type=corpus_list, default=None, metavar="C[,C...]",
                        help=f"a text workload's corpora, one after the other, in place of its preset's (of: "
                             f"{', '.join(CORPORA)}; subword workloads: {', '.join(DOCUMENT_CORPORA)}), for traces of "
                             "more workers than the preset's text holds")
    add_compress_arguments(parser, "record the elements this sparsifier chooses from each worker's whole "
                                   "gradient instead of the embedding rows")


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.steps < 1:
        raise UsageError("--workers and --steps must be >= 1")
    try:
        options = parse_compress_options(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    compress = None if args.compress is None else {
        "name": args.compress, "density": args.density, **with_defaults(args.compress, options)}
    if args.corpora is not None and not reads_text(args.workload):
        raise UsageError(f"--corpora: workload {args.workload!r} reads no text")
    try:
        s = profile(args.workload, args.preset, args.workers, args.steps, args.seed, args.out, args.update,
                    args.rows_from, compress, args.corpora)
    except CorpusChoiceError as e:
        raise UsageError(f"--corpora: {e}") from None
    u = s["union"]
    what = "parameter elements" if compress else "embedding rows"
    print(f"{s['workload']}/{s['preset']}: {s['num_rows']} {what}, {s['workers']} workers x "
          f"{s['steps']} steps in {s['seconds']:.1f} s")
    print(f"  density per worker  {s['density']['mean']:.4%}  "
          f"(min {min(s['density']['per_worker']):.4%}, max {max(s['density']['per_worker']):.4%})")
    pairs = list(zip(u["n"], u["density"], u["gamma"], strict=True))
    print("  union density       " + "  ".join(f"n={n}: {d:.4%}" for n, d, _ in pairs))
    print("  gamma^n             " + "  ".join(f"n={n}: {g:.2f}" for n, _, g in pairs))
    print(f"  overlap             mean {s['overlap']['mean']:.3f} "
          f"(min {s['overlap']['min']:.3f}, max {s['overlap']['max']:.3f})")
    print(f"  skewness            8 parts {s['skewness']['8']:.2f}, 128 parts {s['skewness']['128']:.2f}")
    print("  share per 1/8       " + " ".join(f"{v:.3f}" for v in s["partition_share"]))
    if s["loss"]:
        print(f"  loss                {s['loss'][0]:.4f} -> {s['loss'][-1]:.4f}")
    print(f"  wrote {args.out}/{{{','.join(s['files'])}}}")
    return 0
