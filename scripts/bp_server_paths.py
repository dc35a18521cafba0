"""BP's two server paths against each other, on one thread: where `zen.algorithms.bp.COMPACT_RATIO` should sit.

    python scripts/bp_server_paths.py                       # 6.9M elements, widths 1 and 32
    python scripts/bp_server_paths.py --numel 2^23 --widths 1,128

A server sums what the ranks pushed to it and encodes its partition S_r for the pull (hash bitmap). The
dense path adds the messages into the whole (M, D) buffer and scans S_r's rows; the compact path sums over
the sorted distinct received ids and sets their bits by position. For received ids at a share of |S_r|
(the ratio's inverse), each row prints both paths' time (best of two medians, each after a warm-up run)
and checks they give the same message. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys

import torch

from zen.algorithms.bp import compact_sum
from zen.cli_args import count
from zen.encodings import get_encoding
from zen.hashing import HashFamily, server_ranks, server_rows
from zen.kernels_bench import timed
from zen.rows import add_messages

SHARES = (0.1, 0.2, 0.25, 0.33, 0.5)


def compare(numel: int, width: int, world: int, shares: tuple[float, ...], repeats: int) -> list[tuple]:
    """(share, compact ms, dense ms) for server 0 of `world`, `world` messages of random S_0 rows each."""
    encoding, rows = get_encoding("hash_bitmap"), numel // width
    family = HashFamily.from_seed(123, 3)
    cpu = torch.device("cpu")
    members, offsets = server_rows(rows, world, family, cpu)
    mine = members[offsets[0] : offsets[1]]
    positions = server_ranks(rows, world, family, cpu, 0)
    buffer = torch.zeros(rows, width)
    gen = torch.Generator().manual_seed(0)
    out = []
    for share in shares:
        per = int(mine.numel() * share / world)
        received = [(mine[torch.randperm(mine.numel(), generator=gen)[:per]], torch.randn(per, width, generator=gen))
                    for _ in range(world)]

        def compact(received: list = received) -> tuple:
            ids, sums = compact_sum(received, width)
            return encoding.encode_rows(ids, sums, mine, rows, positions, mine.dtype)

        def dense(received: list = received) -> tuple:
            buffer.zero_()
            add_messages(buffer, received)
            return encoding.encode(buffer, mine, mine.dtype)

        (c_payload, c_values), _ = compact()
        (d_payload, d_values), _ = dense()
        if not (torch.equal(c_payload, d_payload) and torch.equal(c_values, d_values)):
            raise AssertionError(f"the two paths' messages differ at share {share}")
        out.append((share, min(timed(compact, repeats, cpu) for _ in range(2)) * 1e3,
                    min(timed(dense, repeats, cpu) for _ in range(2)) * 1e3))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=count, default=6_900_000, help="elements of the tensor (rows x width)")
    parser.add_argument("--widths", default="1,32", help="row widths, comma-separated")
    parser.add_argument("-n", "--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        parser.error(f"--widths must be integers, got {args.widths!r}")
    if any(w < 1 for w in widths) or args.world_size < 1 or args.repeats < 1:
        parser.error("widths, --world-size and --repeats must be >= 1")
    torch.set_num_threads(1)
    print(f"# one thread, {args.numel} elements, server 0 of {args.world_size}; ms, best of two medians of "
          f"{args.repeats}")
    print(f"{'width':>5} {'received/|S_r|':>14} {'compact':>8} {'dense':>8} {'dense/compact':>13}")
    for width in widths:
        for share, c, d in compare(args.numel, width, args.world_size, SHARES, args.repeats):
            print(f"{width:>5} {share:>14.2f} {c:>8.2f} {d:>8.2f} {d / c:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
