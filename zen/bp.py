"""Balanced Parallelism (paper section 5.3): hash-partition, push COO point-to-point, aggregate once
at each server, pull the aggregated partitions back with the hash-bitmap encoding."""

from __future__ import annotations

import torch

from zen import encoding, native
from zen.comm.base import Communicator
from zen.hashing import HashFamily, hierarchical_hash, server_rows
from zen.prediction import count_meta
from zen.registry import register_scheme
from zen.rows import add_rows, concat, put_rows
from zen.types import LocalGrad, PhaseBytes, SyncStats, WireLayout


@register_scheme("zen-bp")
class BalancedParallelism:
    """n = world size servers; server j owns the rows with h0(row) = j."""

    name = "zen-bp"
    sparse_input = True

    def __init__(self, pull: str = "hash_bitmap", k: int = 3, r1_factor: float = 2.0, r2_ratio: float = 0.1):
        if pull not in encoding.ENCODINGS:
            raise ValueError(f"unknown pull encoding {pull!r}; choose one of {', '.join(encoding.ENCODINGS)}")
        if k < 1 or r1_factor <= 0 or r2_ratio <= 0:
            raise ValueError("need k >= 1, r1_factor > 0 and r2_ratio > 0")
        self.pull = pull
        self.k = k
        self.r1_factor = r1_factor
        self.r2_ratio = r2_ratio

    def __call__(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats) -> None:
        family = HashFamily.from_seed(comm.shared_seed(), self.k)
        self.push(grad, comm, out, stats, family)
        self.pull_back(grad, comm, out, stats, family)

    def push(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats,
             family: HashFamily) -> None:
        """Partition this rank's non-zeros, send each partition to its server, aggregate ours in `out`."""
        index, values = grad.rows()
        n = comm.world_size
        parts = hierarchical_hash(index, n, family, self.r1_factor, self.r2_ratio)
        stats.nnz = int(index.numel())
        stats.push_counts = parts.counts
        stats.extra["serial_rows"] = float(parts.serial)
        wire_index = index.index_select(0, parts.order).to(grad.index_dtype())
        wire_values = values.index_select(0, parts.order)
        messages = list(zip(wire_index.split(parts.counts), wire_values.split(parts.counts), strict=True))
        received = comm.all_to_all_v(messages, phase="push")
        out.zero_()
        add_rows(out, concat([m[0] for m in received]), concat([m[1] for m in received]))

    def pull_back(self, grad: LocalGrad, comm: Communicator, out: torch.Tensor, stats: SyncStats,
                  family: HashFamily) -> None:
        """Ship our aggregated partition to everyone; write the others' partitions into `out`."""
        n, r = comm.world_size, comm.rank
        members, offsets = server_rows(grad.num_rows, n, family, out.device)
        mine = members[offsets[r] : offsets[r + 1]]
        message, count = encoding.encode(self.pull, out, mine, grad.index_dtype())
        stats.server_count = count
        decode = encoding.decoder(self.pull, grad.num_rows)
        for j, (payload, values) in enumerate(comm.all_gather_v(message, phase="pull")):
            rows_j = members[offsets[j] : offsets[j + 1]]
            fused = j != r and self.pull == "hash_bitmap" and native.scatter_hash_bitmap(out, payload, rows_j, values)
            if j != r and not fused:
                put_rows(out, decode(payload, rows_j), values)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """push_r = sum_{i != r} |I_i ∩ S_r| coo_row; pull_r = sum_{j != r} payload_j (section 4)."""
        P, M = layout.world_size, layout.rows
        if P == 1:
            return [{}]
        family = HashFamily.from_seed(layout.seed, self.k)
        sent = torch.stack([torch.bincount(family.h0(s, P), minlength=P) for s in sets])  # [i, j]
        union = torch.bincount(family.h0(torch.unique(torch.cat(sets)), P), minlength=P).tolist()
        _, offsets = server_rows(M, P, family, torch.device("cpu"))
        owned = [offsets[j + 1] - offsets[j] for j in range(P)]
        values = [u * layout.width * layout.value_bytes for u in union]
        payload = {
            "hash_bitmap": [-(-owned[j] // 8) + values[j] for j in range(P)],
            "coo": [union[j] * layout.coo_row for j in range(P)],
            "bitmap": [-(-M // 8) + values[j] for j in range(P)],
        }[self.pull]
        pushed_to = sent.sum(0).tolist()
        return [{"push": (pushed_to[r] - int(sent[r, r])) * layout.coo_row,
                 "pull": sum(payload) - payload[r], "meta": 2 * count_meta(P, 2)} for r in range(P)]
