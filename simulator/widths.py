"""A schedule at the paper's row widths from two recordings of a narrower problem, where that is exact.

Why: at Table 1's sizes a row is 768-2,232 floats wide, and running the real scheme code on such rows for every
shard group, machine count and scheme is what made a paper-scale recording take hours here. A message carries
its rows' values (rows x width x value bytes), their ids, bitmaps or block offsets, and a header. So:

- for a scheme whose choices (which rows go where, which encoding) do not depend on the row width, every
  message's bytes are affine in the width, b(w) = a + c w: recordings at widths 1 and 2 give them at any width
  exactly (`AFFINE`, each with its reason);
- OmniReduce cuts the flattened table into blocks of 256 elements: with width w = g w' and block 256 = g b',
  element (row r, column c) falls in block floor((r w + c) / 256) = floor((r w' + floor(c / g)) / b'), so the
  same blocks are non-zero, their offset words are the same, and only the values scale, by g: recordings at
  (w / g, block 256 / g) and (2 w / g, 512 / g) give the paper's (w, 256) exactly (g = gcd(w, 256) >= 4);
- SparCML's variant and dense switch compare row bytes with id bytes, so its choices do depend on the width;
  recorded at widths 1 and 2 with `switch_width` set to the true width, it takes the true width's choices,
  and its bytes are affine again (this is what keeps a 1,024-GPU recording inside this machine's memory);
- every other scheme is recorded at its true width.

`plan` says which; tests/test_simulator.py holds each plan's extrapolation against an exact recording.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import gcd
from typing import Any

from simulator.schedule import Comm, Item

AFFINE = {
    "agsparse": "all-gathers each rank's (ids, rows): no choice at all",
    "sparse_ps": "ids and rows to the owners of contiguous ranges, sums back: no choice at all",
    "zen": "partitions, pull encoding and id coding are fixed per plan (choice=bp|bp-range|hc|ag...); the "
           "server's compact or dense summing path changes local work, not bytes",
}
OMNI_BLOCK = 256  # OmniReduce's block (the paper's 256 elements, baselines/omnireduce.py's default)


@dataclass(frozen=True)
class Plan:
    """Record the scheme at `widths[i]` with `options[i]` (i = 0, 1: scale k = 1, 2); its bytes are affine in k,
    and k = `target` is the problem asked for."""

    widths: tuple[int, int]
    options: tuple[dict[str, Any], dict[str, Any]]
    target: int


def plan(scheme: str, width: int, options: dict[str, Any]) -> Plan | None:
    """How to record `scheme` at `width` from two narrower recordings; None: record it at `width`."""
    if scheme in AFFINE and width > 2:
        return Plan((1, 2), (options, options), width)
    if scheme == "sparcml" and width > 2 and options.get("switch_width") is None:
        decide = {**options, "switch_width": width}
        return Plan((1, 2), (decide, decide), width)
    g = gcd(width, OMNI_BLOCK)
    if scheme == "omnireduce" and "block_size" not in options and g >= 4:
        blocks = ({"block_size": OMNI_BLOCK // g}, {"block_size": 2 * OMNI_BLOCK // g})
        return Plan((width // g, 2 * width // g), blocks, g)
    return None


def extrapolate(narrow: Sequence[Sequence[Item]], wider: Sequence[Sequence[Item]], target: int) -> list[list[Item]]:
    """Per rank, the schedule at scale `target` from recordings at scales 1 (`narrow`) and 2 (`wider`): the same
    primitives in the same order (else the scheme chose differently at the two: ValueError), each byte count on
    the line through its two values. Local work is dropped: the caller models it."""
    out = []
    for rank, (a_items, b_items) in enumerate(zip(narrow, wider, strict=True)):
        a_comms = [i for i in a_items if isinstance(i, Comm)]
        b_comms = [i for i in b_items if isinstance(i, Comm)]
        if [_shape(i) for i in a_comms] != [_shape(i) for i in b_comms]:
            raise ValueError(f"rank {rank}: the two narrow recordings differ in their messages: the scheme's "
                             "choices depend on the width, so it must be recorded at its true width")
        out.append([_line(a, b, target) for a, b in zip(a_comms, b_comms, strict=True)])
    return out


def _shape(item: Comm) -> tuple:
    return item.kind, item.call, tuple(sorted(item.sends)), tuple(sorted(item.recvs)), item.itemsize, item.group


def _at(a: int, b: int, target: int) -> int:
    value = a + (b - a) * (target - 1)
    if value < 0:
        raise ValueError(f"bytes {a} and {b} at scales 1 and 2 extrapolate below zero at {target}")
    return value


def _line(a: Comm, b: Comm, target: int) -> Comm:
    return Comm(a.kind, a.call, {p: _at(n, b.sends[p], target) for p, n in a.sends.items()},
                {p: _at(n, b.recvs[p], target) for p, n in a.recvs.items()}, _at(a.nbytes, b.nbytes, target),
                a.itemsize, a.group)


def tiled(items: Sequence[Item], k: int) -> list[Item]:
    """A rank's messages with every byte count times `k`: the recorded problem's pattern repeated k times, as
    the paper's element-level analysis scales a trace (headers scale too, a few bytes a message)."""
    return [Comm(i.kind, i.call, {p: k * b for p, b in i.sends.items()}, {p: k * b for p, b in i.recvs.items()},
                 k * i.nbytes, i.itemsize, i.group) if isinstance(i, Comm) else i for i in items]
