"""Measured bytes equal the cost formulas exactly, computed independently from the index sets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import zen
from harness.bench.patterns import make_gradient
from zen import costmodel
from zen.comm.base import ring_chunk
from zen.encodings import encodings, get_encoding
from zen.hashing import HashFamily
from zen.prediction import predict
from zen.types import WireLayout

IDX, VAL = 4, 4  # int32 row ids, fp32 values
# One server's pull message for |S_j| = owned rows, nonzero of them non-zero, M rows in all (section 4).
HAND_PAYLOAD = {
    "hash_bitmap": lambda owned, nonzero, M: -(-owned // 8) + nonzero * VAL,
    "coo": lambda owned, nonzero, M: nonzero * (IDX + VAL),
    "bitmap": lambda owned, nonzero, M: -(-M // 8) + nonzero * VAL,
}


def grads(P: int, numel: int = 4099, density: float = 0.03, pattern: str = "random") -> list[torch.Tensor]:
    return [make_gradient(pattern, numel, density, r, P, seed=11) for r in range(P)]


def nonzero_sets(tensors: list[torch.Tensor]) -> list[set[int]]:
    return [set(t.nonzero().view(-1).tolist()) for t in tensors]


FIXED = 16 * 8  # a fixed all-gather: call, code, length, values (zen.comm.base)
HEAD = 8 * 8  # a message's header: call, code, layout, the row counts of up to 5 tensors


def validation_meta(P: int) -> int:
    return (P - 1) * FIXED


@pytest.mark.parametrize("P", [2, 3, 4, 7])
def test_allreduce_bytes(P: int) -> None:
    ts = grads(P)
    res = zen.simulate("allreduce", ts)
    M = ts[0].numel()
    assert res.phases["allreduce"] == [2 * (M - ring_chunk(M, P, r)) * VAL for r in range(P)]
    assert res.phases["meta"] == [validation_meta(P)] * P
    if M % P == 0:
        assert res.phases["allreduce"][0] == 2 * (P - 1) / P * M * VAL


@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("pattern", ["random", "identical", "disjoint", "zipf"])
def test_agsparse_bytes(P: int, pattern: str) -> None:
    ts = grads(P, pattern=pattern)
    sets = nonzero_sets(ts)
    res = zen.simulate("agsparse", ts)
    expect = [sum(len(sets[j]) for j in range(P) if j != r) * (IDX + VAL) for r in range(P)]
    assert res.phases["gather"] == expect
    assert res.phases["meta"] == [validation_meta(P) + (P - 1) * FIXED] * P


@pytest.mark.parametrize("P", [2, 3, 4, 8])
@pytest.mark.parametrize("pattern", ["random", "identical", "disjoint", "zipf"])
@pytest.mark.parametrize("pull", encodings())
def test_bp_bytes(P: int, pattern: str, pull: str) -> None:
    """Every registered encoding: measured pull = its payload_bytes on hash sets computed here."""
    ts = grads(P, pattern=pattern)
    M = ts[0].numel()
    sets = nonzero_sets(ts)
    union = set().union(*sets)
    seed = 1234
    res = zen.simulate("zen-bp", ts, seed=seed, warmup=1, pull=pull)
    server = HashFamily.from_seed(seed).h0(torch.arange(M), P).tolist()
    owned = [{i for i in range(M) if server[i] == j} for j in range(P)]
    push = [sum(len(sets[i] & owned[r]) for i in range(P) if i != r) * (IDX + VAL) for r in range(P)]
    encoding, layout = get_encoding(pull), WireLayout(P, M)
    payload = [encoding.payload_bytes(len(owned[j]), len(union & owned[j]), layout) for j in range(P)]
    pulls = [sum(payload[j] for j in range(P) if j != r) for r in range(P)]
    assert res.phases["push"] == push
    assert res.phases["pull"] == pulls
    assert res.phases["meta"] == [validation_meta(P) + (P - 1) * (HEAD + FIXED)] * P


@pytest.mark.parametrize(("pull", "hand"), HAND_PAYLOAD.items())
def test_builtin_payload_bytes(pull: str, hand: Callable[[int, int, int], int]) -> None:
    M = 1001
    for owned, nonzero in [(0, 0), (1, 0), (1, 1), (8, 3), (9, 9), (250, 17), (M, M)]:
        assert get_encoding(pull).payload_bytes(owned, nonzero, WireLayout(4, M)) == hand(owned, nonzero, M)


@pytest.mark.parametrize("pull", encodings())
def test_bp_closed_form_pull(pull: str) -> None:
    """The cost model's pull bytes of every registered encoding are the mean exact prediction, up to the
    hash partitions' imbalance (gamma from the actual union)."""
    P, M, nnz = 8, 1 << 16, 2000
    gen = torch.Generator().manual_seed(5)
    sets = [torch.randperm(M, generator=gen)[:nnz].sort().values for _ in range(P)]
    union = torch.unique(torch.cat(sets)).numel()
    exact = predict("zen-bp", sets, WireLayout(P, M, seed=9), pull=pull)
    mean = sum(phases["pull"] for phases in exact) / P
    assert get_encoding(pull).pull_bytes(WireLayout(P, M), union) == pytest.approx(mean, rel=0.02)


@pytest.mark.parametrize("P", [2, 4, 8])
def test_hc_bytes_power_of_two(P: int) -> None:
    ts = grads(P)
    sets = nonzero_sets(ts)
    res = zen.simulate("zen-hc", ts)
    for r in range(P):
        expect, level = 0, 0
        while (1 << level) < P:
            block = 1 << level
            partner_block = ((r ^ block) // block) * block
            expect += len(set().union(*sets[partner_block:partner_block + block])) * (IDX + VAL)
            level += 1
        assert res.phases["reduce"][r] == expect


def leb128_length(gap: int) -> int:
    return max(1, -(-gap.bit_length() // 7))


@pytest.mark.parametrize("P", [2, 4, 8])
def test_hc_gap_coded_bytes_by_hand(P: int) -> None:
    """HC with gap-coded ids receives, per partner block's union, one LEB128 code per row of its gap minus
    one plus the values; the closed form's expected code length is the mean within 3% on random sets."""
    ts = grads(P, numel=1 << 15, density=0.02)
    sets = nonzero_sets(ts)
    res = zen.simulate("zen-hc", ts, ids="gaps")
    closed = costmodel.closed_form("zen-hc", costmodel.Sparsity(
        n=P, rows=1 << 15, density=sum(map(len, sets)) / P / (1 << 15),
        gamma=lambda m: len(set().union(*sets[:m])) / len(sets[0])), ids="gaps").bytes_received
    for r in range(P):
        expect, level = 0, 0
        while (1 << level) < P:
            block = 1 << level
            partner_block = ((r ^ block) // block) * block
            union = sorted(set().union(*sets[partner_block:partner_block + block]))
            codes = sum(leb128_length(b - a - 1) for a, b in zip([-1, *union], union, strict=False))
            expect += codes + len(union) * VAL
            level += 1
        assert res.phases["reduce"][r] == expect
    assert closed == pytest.approx(sum(res.phases["reduce"]) / P, rel=0.03)


def test_zen_done_criteria_small() -> None:
    """The issue's simulation criteria at a smaller size: zen <= 1.10x the BP formula with hash-bitmap
    pull and <= 0.15x allreduce; push and pull imbalance <= 1.10 for random and zipf."""
    from harness.bench.harness import BenchConfig, rows, run_sim

    for pattern in ("random", "zipf"):
        cfg = BenchConfig(world_size=16, numel=1 << 21, density=0.01, pattern=pattern,
                          schemes=["allreduce", "zen"], warmup=1)
        table = {r["scheme"]: r for r in rows(cfg, run_sim(cfg))}
        z = table["zen"]
        M, n, d = cfg.numel, cfg.world_size, cfg.density
        w = costmodel.Sparsity(n=n, rows=M, density=d, gamma=lambda m, g=z["union_density"] / d: g)
        formula = costmodel.closed_form("zen-bp", w).bytes_received
        assert z["choice"] == "bp"
        assert z["bytes_received_max"] <= 1.10 * formula
        assert z["bytes_received_max"] <= 0.15 * table["allreduce"]["bytes_received_max"]
        assert z["push_imbalance"] <= 1.10 and z["pull_imbalance"] <= 1.10
