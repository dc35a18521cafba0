"""Times scripts/ddp_user_script.py's training under every hook, dense and sparse embeddings, in one launch.

    python scripts/ddp_user_bench.py -n 2                      # loopback gloo
    python scripts/ddp_user_bench.py -n 4 --bandwidth 1gbit    # emulated cluster (harness/netem.py)

Variants run in interleaved rounds (ddp, allreduce, zen, ddp, ...) so machine drift hits them alike; each
row is the median ms/step over all rounds' timed steps with the 10th-90th percentile, and the ratio to
DDP's built-in allreduce from the same launch. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddp_user_script import HOOKS, train  # noqa: E402

from harness.launch import spawn  # noqa: E402

MODELS = {"dense": ("recommender", False), "sparse": ("recommender", True), "mlp": ("dense", False)}


def compare(hooks: list[str], models: list[str], rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """One rank: every (hook, model) variant `rounds` times, interleaved."""
    out: dict[str, Any] = {}
    for _ in range(rounds):
        for name in models:
            model, sp = MODELS[name]
            for hook in hooks:
                res = train(hook, sp, steps, warmup, model_name=model)
                cell = out.setdefault(f"{hook}/{name}", {"times": [], "checksum": res["checksum"]})
                cell["times"] += res["times"]
                cell["loss"] = res["losses"][-1]
    return out


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--world-size", type=int, default=2)
    parser.add_argument("--bandwidth", default=None, help="emulated per-node link rate, e.g. 1gbit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--hooks", default=",".join(HOOKS))
    parser.add_argument("--models", default="dense,sparse,mlp",
                        help="dense / sparse: the recommender with dense / COO embedding gradients; mlp: all dense")
    args = parser.parse_args(argv)
    hooks, models = args.hooks.split(","), args.models.split(",")
    if not set(hooks) <= set(HOOKS) or not set(models) <= set(MODELS):
        parser.error(f"--hooks from {HOOKS}, --models from {tuple(MODELS)}")
    kwargs = {"hooks": hooks, "models": models, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup}
    target = "ddp_user_bench:compare"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
    if args.bandwidth:
        from harness.netem import emulated_cluster

        with emulated_cluster(args.world_size, args.bandwidth) as cluster:
            where = cluster.spawn_kwargs()
            base_env = where.pop("env", None)
            results = spawn(target, args.world_size, kwargs, timeout_s=3600,
                            env=lambda r: {**(base_env(r) if base_env else {}), **env}, **where)
    else:
        results = spawn(target, args.world_size, kwargs, timeout_s=3600, env=lambda r: env)
    rows = results[0]
    print(f"user DDP script, {args.world_size} gloo ranks, {args.bandwidth or 'loopback'}, {args.rounds} rounds x "
          f"{args.steps - args.warmup} timed steps")
    print(f"{'model':>10} {'hook':>10} {'ms/step':>9} {'p10':>8} {'p90':>8} {'vs ddp':>7} {'same params':>11}")
    for name in models:
        base = statistics.median(rows[f"ddp/{name}"]["times"]) if "ddp" in hooks else None
        for hook in hooks:
            cell = rows[f"{hook}/{name}"]
            t = cell["times"]
            med = statistics.median(t)
            same = all(r[f"{hook}/{name}"]["checksum"] == cell["checksum"] for r in results)
            ratio = f"{med / base:6.2f}x" if base else "-"
            print(f"{name:>10} {hook:>10} {med * 1e3:9.2f} {quantile(t, 0.1) * 1e3:8.2f} "
                  f"{quantile(t, 0.9) * 1e3:8.2f} {ratio:>7} {str(same):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
