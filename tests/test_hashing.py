"""Hierarchical hashing and bit packing: lossless, index-0 safe, consistent, balanced."""

from __future__ import annotations

import pytest
import torch

from zen.encoding import pack_bits, unpack_bits
from zen.hashing import HashFamily, hierarchical_hash, server_rows


def membership(index: torch.Tensor, parts) -> list[set[int]]:
    out, start = [], 0
    for c in parts.counts:
        out.append(set(index[parts.order[start:start + c]].tolist()))
        start += c
    return out


@pytest.mark.parametrize("n", [1, 3, 16, 128])
@pytest.mark.parametrize("nnz", [0, 1, 100, 5000])
def test_lossless_and_consistent_with_h0(n: int, nnz: int) -> None:
    fam = HashFamily.from_seed(7)
    index = torch.randperm(100_000)[:nnz]
    if nnz:
        index[0] = 0
    parts = hierarchical_hash(index, n, fam)
    assert sorted(parts.order.tolist()) == list(range(nnz))  # every row exactly once
    h0 = fam.h0(index, n)
    for j, members in enumerate(membership(index, parts)):
        assert members == set(index[h0 == j].tolist())


def test_serial_region_grows_instead_of_dropping() -> None:
    fam = HashFamily.from_seed(3)
    index = torch.arange(4000)
    parts = hierarchical_hash(index, 4, fam, r1_factor=0.05, r2_ratio=0.01)  # tiny regions
    assert parts.serial > 0
    assert sorted(parts.order.tolist()) == list(range(4000))


def test_serial_fraction_small_at_paper_parameters() -> None:
    fam = HashFamily.from_seed(5)
    index = torch.randperm(1 << 22)[:40_000]
    parts = hierarchical_hash(index, 16, fam)  # k = 3, r1 = 2 |G| d_G
    assert parts.serial / 40_000 < 0.05


def test_same_seed_same_hash_on_every_size() -> None:
    a, b = HashFamily.from_seed(11), HashFamily.from_seed(11)
    idx = torch.arange(1000)
    assert torch.equal(a.h0(idx, 8), b.h0(idx, 8))
    members_small, off_small = server_rows(1000, 8, a, torch.device("cpu"))
    members_big, off_big = server_rows(5000, 8, a, torch.device("cpu"))
    for j in range(8):  # one h0 for every tensor size: S_j of the small tensor is a prefix
        small = members_small[off_small[j]:off_small[j + 1]].tolist()
        big = [i for i in members_big[off_big[j]:off_big[j + 1]].tolist() if i < 1000]
        assert small == big


def test_hash_matches_uint32_arithmetic() -> None:
    """The int64 torch formulation equals plain 32-bit unsigned arithmetic (what kernels use)."""
    fam = HashFamily.from_seed(42)
    a, b = fam.coeffs[0]

    def mix(x: int) -> int:
        h = (x * a + b) & 0xFFFFFFFF
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    xs = [0, 1, 2, 12345, 2**31 - 1, 2**32 - 1]
    assert fam.hash32(torch.tensor(xs), 0).tolist() == [mix(x) for x in xs]


def test_balance_of_h0() -> None:
    fam = HashFamily.from_seed(1)
    counts = torch.bincount(fam.h0(torch.arange(1 << 20), 16), minlength=16)
    assert counts.max().item() * 16 / (1 << 20) < 1.01
    low = torch.bincount(fam.h0(torch.arange(20_000), 8), minlength=8)  # skewed low ids spread too
    assert low.max().item() * 8 / 20_000 < 1.05


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 1000])
def test_bits_roundtrip(length: int) -> None:
    mask = torch.rand(length) < 0.3
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-length // 8)
    assert torch.equal(unpack_bits(packed, length), mask)
