"""What one small message costs the CPU when it goes through the kernel's TCP stack here: the price of
OmniReduce's streaming if every 256-element block (1,028 bytes with its next offset) were one TCP message, set
beside the per-block cost that would bring the simulated Fig 11 ratios to the paper's (results/README.md's
OmniReduce section). OmniReduce's own transports are RDMA and DPDK, which this machine cannot run: this is the
kernel path's cost, as a reference, not OmniReduce's.

A sender thread writes `count` messages of `size` bytes, one send call each, to a receiver thread reading them
one receive call each over a loopback TCP connection (Nagle off); the process's CPU time (both threads, user and
system) over the messages is the cost of one message sent and received. Python's per-call overhead is in it, so
it is an upper bound on the kernel's share. Medians over repeats.

    python -m harness.bench.block_messages [--count 100000] [--size 1028] [--repeats 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time

from zen.cli_args import positive_int


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad arguments: one line, exit 2
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sender, receiver


def one_run(count: int, size: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per message of `size` bytes, sent and received."""
    sender, receiver = _pair()
    payload = bytes(size)
    buf = bytearray(size)
    view = memoryview(buf)

    def receive() -> None:
        for _ in range(count):
            got = 0
            while got < size:
                got += receiver.recv_into(view[got:], size - got)

    reader = threading.Thread(target=receive)
    cpu, wall = time.process_time(), time.perf_counter()
    reader.start()
    for _ in range(count):
        sender.sendall(payload)
    reader.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    sender.close()
    receiver.close()
    return cpu / count, wall / count


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m harness.bench.block_messages", description="a small TCP message's CPU cost here")
    p.add_argument("--count", type=positive_int, default=100_000)
    p.add_argument("--size", type=positive_int, default=1028)
    p.add_argument("--repeats", type=positive_int, default=5)
    args = p.parse_args(argv)
    runs = [one_run(args.count, args.size) for _ in range(args.repeats)]
    cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"{args.size} B TCP messages over loopback, one send and one receive call each, {args.count} a run, "
          f"median of {args.repeats}: {1e6 * cpu:.2f} us CPU and {1e6 * wall:.2f} us wall per message")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
