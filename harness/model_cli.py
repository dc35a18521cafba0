"""`zen model`: predicted bytes and time of every scheme, from statistics or from a synthetic pattern.

With --gamma-n (and optional --skew) it evaluates the closed forms of zen.costmodel; with --pattern it
draws the ranks' index sets and uses each scheme's exact `predict`, plus the closed forms next to it.
With --ranks-per-node k > 1 every scheme runs two-level, and bytes and times are those of the busiest node's
uplink, which its k ranks share (the dense bytes inside a node are in the header).
"""

from __future__ import annotations

import argparse

from harness.bench.patterns import PATTERNS, compressed_gradient, index_set
from harness.netem import parse_rate
from zen import costmodel
from zen.cli_args import UsageError, positive_int
from zen.compress import sparsifiers
from zen.prediction import predict, uplink_bytes
from zen.registry import schemes
from zen.types import WireLayout


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", "-n", type=int, default=16)
    p.add_argument("--numel", type=lambda s: int(float(s)), default=1 << 22)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--pattern", choices=PATTERNS, default=None, help="draw index sets (exact prediction)")
    p.add_argument("--compress", default=None,
                   help="draw index sets as zen bench --compress does: what this sparsifier of --density chooses")
    p.add_argument("--gamma-n", type=float, default=None, help="densification ratio of all n ranks")
    p.add_argument("--skew", type=float, default=1.0, help="skewness of even contiguous ranges")
    p.add_argument("--bandwidth", default="25gbit", help="per-link rate, e.g. 1gbit, 25gbit")
    p.add_argument("--alpha-us", type=float, default=10.0, help="per-message latency in microseconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ranks-per-node", type=positive_int, default=1, help="two-level sync over nodes of this many")


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.density <= 1:
        raise UsageError(f"--density must be in [0, 1], got {args.density}")
    if args.pattern is None and args.gamma_n is None and args.compress is None:
        raise UsageError("give --pattern or --compress (draw index sets) or --gamma-n (closed forms)")
    if args.compress is not None and args.compress not in sparsifiers():
        raise UsageError(f"--compress {args.compress}: choose a sparsifier ({', '.join(sparsifiers())})")
    net = costmodel.Network(alpha=args.alpha_us * 1e-6, bandwidth=parse_rate(args.bandwidth) / 8)
    n, M, k = args.world_size, args.numel, args.ranks_per_node
    if n % k:
        raise UsageError(f"--ranks-per-node {k} must divide --world-size {n} (equal nodes)")
    exact: dict[str, int] = {}
    gamma_n = args.gamma_n
    if args.pattern or args.compress:
        import torch

        sets = [index_set(args.pattern, M, args.density, r, n, args.seed) if args.compress is None else
                compressed_gradient(args.compress, M, args.density, r, args.seed).nonzero().view(-1)
                for r in range(n)]
        gamma_n = torch.unique(torch.cat(sets)).numel() / max(1, sum(s.numel() for s in sets) / n)
        layout = WireLayout(world_size=n, rows=M, seed=args.seed)
        exact = {name: max(uplink_bytes(predict(name, sets, layout, ranks_per_node=k), k)) for name in schemes()}
    w = costmodel.Sparsity(n=n, rows=M, density=args.density, gamma=costmodel.gamma_from_union(n, gamma_n),
                           skew=args.skew)
    intra = costmodel.two_level_cost(w, k, lambda s: costmodel.closed_form("allreduce", s))[0] if k > 1 else 0.0
    print(f"# n={n} numel={M} density={args.density} gamma^n={gamma_n:.3f} skew={args.skew} "
          f"bandwidth={args.bandwidth} alpha={args.alpha_us}us"
          + (f" ranks_per_node={k} (two-level; intra-node dense MB per rank: {intra / 1e6:.3f})" if k > 1 else ""))
    print(f"{'scheme':>18} {'closed-form MB':>15} {'time ms':>9} {'exact MB':>9} {'exact ms':>9}")
    forms = {name: (lambda s, name=name: costmodel.closed_form(name, s)) for name in costmodel.closed_forms()}
    forms["bp-without-index"] = costmodel.bp_without_index
    for name in sorted(set(forms) | set(exact)):
        form = forms.get(name)
        pred = (form(w) if k == 1 else costmodel.two_level_cost(w, k, form)[1]) if form else None
        cells = [f"{k * pred.bytes_received / 1e6:15.3f}", f"{1e3 * costmodel.node_time(pred, k, net):9.2f}"] \
            if pred else ["-".rjust(15), "-".rjust(9)]
        if name in exact:
            cells += [f"{exact[name] / 1e6:9.3f}", f"{1e3 * exact[name] / net.bandwidth:9.2f}"]
        print(f"{name:>18} " + " ".join(cells))
    return 0
