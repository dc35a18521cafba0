"""Hierarchical hashing and bit packing: lossless, index-0 safe, consistent, balanced."""

from __future__ import annotations

import contextlib

import pytest
import torch

from zen import native
from zen.bits import pack_bits, unpack_bits
from zen.encodings import encodings, get_encoding, nonzero_rows
from zen.hashing import HashFamily, hierarchical_hash, server_ranks, server_rows


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


@pytest.mark.parametrize(("M", "n"), [(1, 1), (9, 2), (997, 3), (5003, 8), (20_011, 64)])
def test_server_ranks_are_positions_in_s_j(M: int, n: int) -> None:
    fam = HashFamily.from_seed(M)
    members, offsets = server_rows(M, n, fam, torch.device("cpu"))
    for j in range(n):
        mine = members[offsets[j]:offsets[j + 1]]
        positions = server_ranks(M, n, fam, torch.device("cpu"), j)(mine)
        assert torch.equal(positions.long(), torch.arange(mine.numel()))


@pytest.mark.parametrize("pull", encodings())
@pytest.mark.parametrize(("M", "n", "D"), [(997, 3, 1), (5003, 4, 1), (61, 5, 7), (20_011, 8, 3)])
def test_encode_rows_matches_scan(pull: str, M: int, n: int, D: int) -> None:
    """The sparse encode (from a server's non-zero rows) sends exactly the bytes of the full scan of S_j,
    where cancelled (zero, -0.0) rows are skipped, with native kernels and with the torch-op path."""
    fam = HashFamily.from_seed(M + n)
    g = torch.Generator().manual_seed(M)
    members, offsets = server_rows(M, n, fam, torch.device("cpu"))
    for j in range(n):
        mine = members[offsets[j]:offsets[j + 1]]
        k = max(1, mine.numel() // 5)
        rows = mine[torch.randperm(mine.numel(), generator=g)[:k]].sort().values
        out = torch.zeros(M, D)
        out[rows.long()] = torch.randn(k, D, generator=g)
        out[rows[: k // 3].long()] = 0.0
        out[rows[k // 3 : k // 2].long()] = -0.0
        nonzero = rows[out[rows.long()].ne(0).any(1)]
        enc = get_encoding(pull)
        positions = server_ranks(M, n, fam, out.device, j)
        got = enc.encode_rows(nonzero, out[nonzero.long()], mine, M, positions, torch.int32)
        for use_native in (True, False):
            if use_native:
                ref = enc.encode(out, mine, torch.int32)
            else:
                with native.disabled():
                    ref = enc.encode(out, mine, torch.int32)
            assert got[1] == ref[1]
            for a, b in zip(got[0], ref[0], strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("pull", encodings())
@pytest.mark.parametrize(("M", "n", "D"), [(997, 3, 1), (61, 5, 7)])
def test_decode_and_scatter_invert_encode(pull: str, M: int, n: int, D: int) -> None:
    """decode gives the encoded rows, ascending, and scatter (the GPU pull's write) puts the values at
    exactly those rows, with native kernels and with the torch-op path."""
    fam = HashFamily.from_seed(M)
    g = torch.Generator().manual_seed(M + 1)
    members, offsets = server_rows(M, n, fam, torch.device("cpu"))
    out = torch.randn(M, D, generator=g) * (torch.rand(M, 1, generator=g) < 0.3)
    enc = get_encoding(pull)
    for j in range(n):
        mine = members[offsets[j]:offsets[j + 1]]
        (payload, values), _ = enc.encode(out, mine, torch.int32)
        want_rows = mine[nonzero_rows(out[mine.long()])].long()
        for mode in (contextlib.nullcontext(), native.disabled()):
            got = torch.full_like(out, 9.0)
            with mode:
                rows = enc.decode(payload, mine, M)
                enc.scatter(got, payload, mine, values, M)
            assert torch.equal(rows.long(), want_rows)
            assert torch.equal(got, torch.full_like(out, 9.0).index_copy_(0, want_rows, values))
