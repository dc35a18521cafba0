"""Native kernels == torch-op reference (ZEN_NATIVE=0): hash values, partition membership, S_j, hash
bitmap bytes, decode, scatter and whole zen-bp syncs, for fp32 / bf16 / fp16 (and fp64) values, int32 /
int64 indices and adversarial inputs; plus the nvcc compile-only check of the CUDA kernels."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType

import pytest
import torch

import zen
from zen import gaps, hashing, native
from zen.encodings import encodings, get_encoding
from zen.grad import LocalGrad
from zen.native import compile_check
from zen.types import ZenCommError

VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
HASH_BITMAP = get_encoding("hash_bitmap")
_pool = ThreadPoolExecutor(max_workers=1)


@pytest.fixture(scope="module", autouse=True)
def nvcc_check(request: pytest.FixtureRequest) -> Future | None:
    """Starts the nvcc compile check in the background (when selected) to overlap the CPU build."""
    selected = any(item.name == "test_cuda_kernels_compile_with_nvcc" for item in request.session.items)
    return _pool.submit(compile_check.check) if selected and compile_check.find_nvcc() else None


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEN_NATIVE", raising=False)  # a global ZEN_NATIVE=0 would compare reference to itself


@pytest.fixture(scope="session")
def ext() -> ModuleType:
    """The CPU extension, built once per session (cached on disk across sessions)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ZEN_NATIVE", raising=False)
        module = native.get("cpu")
    if module is None:
        pytest.fail("the native CPU extension did not build: run `zen build --verbose`")
    return module


def _family(seed: int = 7, k: int = 3) -> hashing.HashFamily:
    return hashing.HashFamily.from_seed(seed, k)


@pytest.fixture(params=[1, 2], ids=["one-chunk", "chunks"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op threads for a kernel call: one thread runs one chunk and checks its inputs where it
    ends, more run several chunks after a pre-pass that checks them first."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _members(parts: hashing.Partitions, index: torch.Tensor) -> list[list[int]]:
    """Sorted row ids per partition (order inside a partition is free)."""
    return [sorted(index[p].tolist()) for p in parts.order.split(parts.counts)]


def _adversarial_indices(dtype: torch.dtype) -> list[torch.Tensor]:
    top = torch.iinfo(dtype).max if dtype == torch.int32 else 2**32 - 1
    g = torch.Generator().manual_seed(3)
    rnd = torch.randint(0, top, (20_000,), generator=g, dtype=torch.int64).unique()
    return [
        torch.empty(0, dtype=dtype),
        torch.tensor([0], dtype=dtype),
        torch.tensor([top], dtype=dtype),
        torch.tensor([0, 1, 2, top - 1, top], dtype=dtype),
        torch.arange(0, 5000, dtype=dtype),  # dense run of small ids, index 0 included
        torch.tensor([5, 5, 5, 0, 0], dtype=dtype),  # duplicates: each position is its own row
        rnd.to(dtype),
    ]


def test_hash_values_bit_exact(ext: ModuleType) -> None:
    family = _family(k=5)
    for dtype in (torch.int32, torch.int64):
        for index in _adversarial_indices(dtype):
            got = native.hash_values(index, family)
            want = torch.stack([family.hash32(index, level) for level in range(family.k + 1)])
            assert torch.equal(got, want.view(family.k + 1, -1)), dtype


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 3, 16])
def test_partition_membership_matches_reference(ext: ModuleType, dtype: torch.dtype, n: int) -> None:
    family = _family()
    for index in _adversarial_indices(dtype):
        for r1_factor, r2_ratio in ((2.0, 0.1), (0.05, 0.01)):  # paper sizes, and full serial regions
            fast = hashing.hierarchical_hash(index, n, family, r1_factor, r2_ratio)
            with native.disabled():
                ref = hashing.hierarchical_hash(index, n, family, r1_factor, r2_ratio)
            assert fast.counts == ref.counts
            assert sorted(fast.order.tolist()) == list(range(index.numel()))  # lossless, each row once
            assert _members(fast, index) == _members(ref, index)
            if r1_factor < 1 and index.numel() > 1000:
                assert fast.serial > 0  # the overflow path really ran


@pytest.mark.parametrize("n", [1, 3, 8, 16])
def test_partition_rows_are_the_partitions_in_input_order(ext: ModuleType, n: int, threads: int) -> None:
    """BP's CPU push: the rows of each partition of Algorithm 1 (same counts and members), in input order,
    each id with its own row's bits (widths 1 and 3, every value dtype, int32 and int64 ids, narrowed where
    they fit)."""
    family = _family()
    g = torch.Generator().manual_seed(29)
    for dtype in (torch.int32, torch.int64):
        for index in _adversarial_indices(dtype):
            parts = hashing.hierarchical_hash(index, n, family)
            for D, vdtype in ((1, torch.float32), (3, torch.float16), (1, torch.float64), (3, torch.bfloat16)):
                values = torch.randn(index.numel(), D, generator=g).to(vdtype)
                for wire in (torch.int32, torch.int64) if index.numel() == 0 or index.max() < 2**31 else (torch.int64,):
                    got = native.partition_rows(index, values, n, family, wire)
                    assert got is not None
                    ids, rows, counts = got
                    assert counts == parts.counts and ids.dtype == wire and rows.dtype == vdtype
                    pos = torch.cat([torch.nonzero(family.h0(index, n) == p).view(-1) for p in range(n)])
                    assert torch.equal(ids.long(), index[pos].long())
                    assert torch.equal(rows.view(torch.uint8), values[pos].view(torch.uint8))


def test_nonzero_rows_match_reference(ext: ModuleType) -> None:
    g = torch.Generator().manual_seed(5)
    for dtype in VALUE_DTYPES:
        for M, D in ((0, 1), (1, 1), (1000, 1), (4099, 1), (777, 3), (5_000_017, 1)):  # the last: several chunks
            cases = [torch.zeros(M, D, dtype=dtype), torch.ones(M, D, dtype=dtype)]  # empty, full density
            for density in (0.01, 0.07):  # words of 64 holding 0-2 non-zeros (the unrolled path), and more
                sparse = torch.zeros(M, D, dtype=dtype)
                mask = torch.rand(M, generator=g) < density
                sparse[mask, D - 1] = torch.randn(int(mask.sum()), generator=g).to(dtype)
                if M:
                    sparse[0, 0] = 1  # index 0
                    sparse[-1, -1] = -3  # last index
                    sparse[M // 2, 0] = -0.0  # negative zero is zero
                    sparse[M // 3, 0] = float("nan")  # NaN is non-zero
                    sparse[M // 4, 0] = torch.finfo(dtype).tiny / 2  # subnormal is non-zero
                    sparse[M // 5, 0] = float("-inf")
                cases.append(sparse)
            for dense in cases:
                got = LocalGrad(M, D, dtype, dense.device, dense=dense).rows()
                with native.disabled():
                    want = LocalGrad(M, D, dtype, dense.device, dense=dense).rows()
                assert torch.equal(got[0], want[0]) and got[0].dtype == torch.int64
                assert got[1].shape == want[1].shape and got[1].dtype == dtype
                assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))  # bits, NaN included


@pytest.mark.parametrize("num_rows", [0, 1, 7, 100_003])
def test_server_rows_match_reference(ext: ModuleType, num_rows: int) -> None:
    for n in (1, 3, 16):
        fast = native.server_rows(num_rows, n, _family(), "cpu")
        with native.disabled():
            ref = hashing.build_server_rows(num_rows, n, _family().seed, "cpu")
        assert fast is not None
        assert fast[1] == ref[1]
        assert torch.equal(fast[0], ref[0]) and fast[0].dtype == ref[0].dtype


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_hash_bitmap_encode_decode_scatter(ext: ModuleType, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    for M, D, density in ((1, 1, 1.0), (13, 1, 0.5), (10_007, 1, 0.3), (3001, 4, 0.2), (64, 1, 0.0), (999, 1, 1.0)):
        out = torch.zeros(M, D, dtype=dtype)
        mask = torch.rand(M, generator=g) < density
        out[mask] = torch.randn(int(mask.sum()), D, generator=g).to(dtype)
        if M > 2:
            out[1, 0] = -0.0
        all_members, offsets = hashing.server_rows(M, 3, _family(), out.device)
        for j in range(3):
            for idx_dtype in (torch.int32, torch.int64):
                members = all_members[offsets[j] : offsets[j + 1]].to(idx_dtype)
                (payload, values), count = HASH_BITMAP.encode(out, members, torch.int32)
                with native.disabled():
                    (ref_payload, ref_values), ref_count = HASH_BITMAP.encode(out, members, torch.int32)
                assert torch.equal(payload, ref_payload) and count == ref_count
                assert torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))
                ids = HASH_BITMAP.decode(payload, members, M)
                with native.disabled():
                    ref_ids = HASH_BITMAP.decode(payload, members, M)
                assert torch.equal(ids, ref_ids) and ids.dtype == ref_ids.dtype
                got = torch.full_like(out, 9)
                assert native.scatter_hash_bitmap(got, payload, members, values)
                want = torch.full_like(out, 9).index_copy_(0, ref_ids.long(), ref_values)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_fill_hash_bitmap_equals_decode_then_fill_sum(ext: ModuleType, dtype: torch.dtype, threads: int) -> None:
    """BP's one-pass CPU pull == every server's message decoded, then fill_sum, bit for bit: 1 to 8 servers,
    M not a multiple of 64 (a partial last word) or of the 1 KB staging block, widths 1, 3 and 700 (a block
    of one word), empty, sparse and full partitions, messages with padding bits set or not, the mean, an output that
    is 64-byte aligned or not; one chunk and several. Messages at odds with their values or sizes are
    refused, never read past."""
    g = torch.Generator().manual_seed(17)
    for M, D in ((1, 1), (63, 1), (64, 3), (257, 1), (5000, 1), (4097, 3), (300, 700)):
        for n in (1, 3, 4, 8):
            dense = torch.zeros(M, D, dtype=dtype)
            mask = torch.rand(M, generator=g) < (0.0, 0.05, 1.0)[(M + n) % 3]
            dense[mask] = torch.randn(int(mask.sum()), D, generator=g).to(dtype)
            members, offsets = hashing.server_rows(M, n, _family(), dense.device)
            messages = [HASH_BITMAP.encode(dense, members[offsets[j] : offsets[j + 1]], torch.int32)[0]
                        for j in range(n)]
            for j, (payload, _) in enumerate(messages):  # bits past a server's last member are not rows
                if 8 * payload.numel() > offsets[j + 1] - offsets[j] and (M + n) % 2 == 0:
                    payload[-1] |= 0x80
            sets = [(HASH_BITMAP.decode(p, members[offsets[j] : offsets[j + 1]], M), v)
                    for j, (p, v) in enumerate(messages)]
            bits = hashing.server_bits(M, n, _family(), dense.device)
            for divisor in (1, 3) if dtype in (torch.float32, torch.float64) else (1,):
                want = torch.empty(M, D, dtype=dtype)
                got = torch.full((M + 1, D), 9.0, dtype=dtype)[n % 2 :][:M]  # 64-byte aligned or not
                assert native.fill_sum(want, sets, divisor)
                assert native.fill_hash_bitmap(got, messages, bits, divisor)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (M, D, n, divisor)
    bits = hashing.server_bits(100, 2, _family(), torch.device("cpu"))
    members, offsets = hashing.server_rows(100, 2, _family(), torch.device("cpu"))
    ones = torch.ones(100, 1)
    messages = [HASH_BITMAP.encode(ones, members[offsets[j] : offsets[j + 1]], torch.int32)[0] for j in range(2)]
    with pytest.raises(RuntimeError, match="values for"):  # a message with a row too few: not read past
        ext.fill_hash_bitmap(torch.empty(100, 1), [p for p, _ in messages], [messages[0][1], messages[1][1][1:]],
                             bits, 1)
    with pytest.raises(RuntimeError, match="does not match"):  # a payload of the wrong size
        ext.fill_hash_bitmap(torch.empty(100, 1), [messages[0][0][1:], messages[1][0]], [v for _, v in messages],
                             bits, 1)


def test_fill_hash_bitmap_reads_words_of_skewed_membership(ext: ModuleType) -> None:
    """The pull's unchecked blocks read a word's payload bits from any bit of a byte: where a server owns 58 to 64 of
    a word's rows, they span 9 bytes. Membership words made up for it (two servers taking turns at owning almost
    all of a word, 200 words), against decode-then-fill_sum."""
    g = torch.Generator().manual_seed(41)
    W = 200
    M = 64 * W
    owned = torch.rand(W, 64, generator=g) < torch.where(torch.arange(W) % 2 == 0, 0.95, 0.05).view(W, 1)
    owned[:, 0] = torch.arange(W) % 3 == 0  # shifts the cursors off byte boundaries
    masks = [owned, ~owned]
    words = torch.stack([(m.long() << torch.arange(64)).sum(1) for m in masks])  # bit b of word w: row 64 w + b
    for density in (0.3, 1.0):
        messages, sets = [], []
        for m in masks:
            members = torch.nonzero(m.reshape(-1)).view(-1)
            keep = torch.rand(members.numel(), generator=g) < density
            payload = torch.zeros(-(-members.numel() // 8) * 8, dtype=torch.bool)
            payload[: members.numel()] = keep
            bytes_ = (payload.view(-1, 8).long() << torch.arange(8)).sum(1).to(torch.uint8)
            values = torch.randn(int(keep.sum()), 1, generator=g)
            messages.append((bytes_, values))
            sets.append((members[keep].int(), values))
        want, got = torch.empty(M, 1), torch.empty(M, 1)
        assert native.fill_sum(want, sets, 1) and native.fill_hash_bitmap(got, messages, words, 1)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), density


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("ascending", [False, True], ids=["any-order", "ascending"])
def test_aggregate_hash_bitmap_equals_compact_sum_then_encode(ext: ModuleType, dtype: torch.dtype,
                                                              ascending: bool) -> None:
    """A server's one-pass aggregate + encode == the compact sum over sorted distinct ids, then encode_rows, bit
    for bit: overlapping pushes in any order or each ascending (BP's CPU push; int32 ids with one float32 each then
    take the merging path), rows whose sums cancel to zero (left out), -0.0 values, int32 and int64 ids, widths 1
    and 3, 1 to 5 pushes; the sums and the payload lie back to back; a row the server does not own and one outside
    the tensor are refused."""
    from zen.algorithms.bp import compact_sum

    g = torch.Generator().manual_seed(23)
    for M, n, D in ((1, 1, 1), (70, 2, 1), (5000, 3, 1), (6000, 4, 1), (4099, 4, 3)):
        members, offsets = hashing.server_rows(M, n, _family(), torch.device("cpu"))
        for r in range(n):
            mine = members[offsets[r] : offsets[r + 1]].long()
            if not mine.numel():
                continue
            received = []
            for _ in range(n):
                take = mine[torch.randperm(mine.numel(), generator=g)[: max(1, mine.numel() // 3)]]
                if ascending:
                    take = take.sort().values
                values = torch.randn(take.numel(), D, generator=g).to(dtype)
                values[0] = -0.0
                received.append((take.int(), values))
            received.append((received[0][0], -received[0][1]))  # cancels the first push: those sums are zero
            for index_dtype, pushes in ((torch.int32, received), (torch.int64, received), (torch.int32, received[1:2])):
                pushed = [(i.to(index_dtype), v) for i, v in pushes]
                words = hashing.server_bits(M, n, _family(), torch.device("cpu"))[r]
                (payload, values), count = HASH_BITMAP.aggregate(pushed, words, M)
                rows, sums = compact_sum(pushed, D)
                positions = hashing.server_ranks(M, n, _family(), torch.device("cpu"), r)
                (want_payload, want_values), want_count = HASH_BITMAP.encode_rows(
                    rows, sums, mine.int(), M, positions, torch.int32)
                assert torch.equal(payload, want_payload) and count == want_count, (M, n, r)
                assert torch.equal(values.view(torch.uint8), want_values.view(torch.uint8)), (M, n, r)
                # sums, then payload, in one buffer (rows that cancelled closed up): the pull sends it as it lies
                assert not values.numel() or (
                    payload.data_ptr() == values.data_ptr() + values.numel() * values.element_size())
    members, offsets = hashing.server_rows(100, 2, _family(), torch.device("cpu"))
    words = hashing.server_bits(100, 2, _family(), torch.device("cpu"))[0]
    other = members[offsets[1] : offsets[2]][:1]
    mine = members[offsets[0] : offsets[1]][:2]
    both = torch.cat([mine, other]).sort(descending=not ascending).values
    for pushed in ([other], [both]):
        with pytest.raises(RuntimeError, match="does not own"):
            ext.aggregate_hash_bitmap(pushed, [torch.ones(pushed[0].numel(), 1)], words, 100)
    for index_dtype in (torch.int64, torch.int32):
        for ids in ([100], [0, 100] if ascending else [100, 0], [-1, 0]):
            with pytest.raises(RuntimeError, match="outside"):
                ext.aggregate_hash_bitmap([torch.tensor(ids, dtype=index_dtype)], [torch.ones(len(ids), 1)], words, 100)


def test_decode_ignores_padding_bits(ext: ModuleType) -> None:
    members = torch.arange(11, dtype=torch.int32)
    payload = torch.tensor([0b10000001, 0xFF], dtype=torch.uint8)  # bits 11..15 lie past the 11 members
    assert native.decode_hash_bitmap(payload, members).tolist() == [0, 7, 8, 9, 10]
    with native.disabled():
        assert HASH_BITMAP.decode(payload, members, 11).tolist() == [0, 7, 8, 9, 10]


def _simulate_both(tensors: list[torch.Tensor], **options) -> tuple[zen.SimResult, zen.SimResult]:
    hashing.TABLES.clear()
    fast = zen.simulate("zen-bp", tensors, seed=1, **options)
    hashing.TABLES.clear()
    with native.disabled():
        ref = zen.simulate("zen-bp", tensors, seed=1, **options)
    hashing.TABLES.clear()
    return fast, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_simulate_zen_bp_native_equals_reference(ext: ModuleType, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    M, P = 50_000, 4
    tensors = []
    for r in range(P):
        t = torch.zeros(M, dtype=dtype)
        idx = torch.randint(0, M, (M // 50,), generator=g)
        t[idx] = torch.randn(idx.numel(), generator=g).to(dtype)
        t[0], t[-1] = r + 1, -(r + 1)  # first and last index on every rank
        tensors.append(t)
    tensors[1].zero_()  # a rank with nothing to send
    for pull in encodings():
        fast, ref = _simulate_both(tensors, pull=pull)
        for a, b in zip(fast.outputs, ref.outputs, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert fast.bytes_sent == ref.bytes_sent and fast.bytes_received == ref.bytes_received
        assert [s.push_counts for s in fast.stats] == [s.push_counts for s in ref.stats]
        assert [s.server_count for s in fast.stats] == [s.server_count for s in ref.stats]


def test_simulate_zen_bp_sparse_rows(ext: ModuleType) -> None:
    """Sparse COO input (rows of width 8, duplicates summed) through native hashing and bitmap."""
    g = torch.Generator().manual_seed(4)
    tensors = []
    for _ in range(3):
        rows = torch.randint(0, 2000, (300,), generator=g)
        rows[0] = 0
        tensors.append(torch.sparse_coo_tensor(rows.view(1, -1), torch.randn(300, 8, generator=g), (2000, 8),
                                               check_invariants=True))
    fast, ref = _simulate_both(tensors)
    for a, b in zip(fast.outputs, ref.outputs, strict=True):
        assert torch.equal(a, b)


def _sorted_rows(n: int, top: int, width: int, dtype: torch.dtype, index_dtype: torch.dtype,
                 g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randperm(top, generator=g)[:n].sort().values.to(index_dtype)
    values = (torch.randn(n, width, generator=g) + 0.25).to(dtype)
    return ids, values


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("width", [1, 3])
def test_merge_rows_matches_reference(ext: ModuleType, dtype: torch.dtype, index_dtype: torch.dtype,
                                      width: int) -> None:
    """HC's union step: native lanes (and the vector merge of int32 ids and float32 values) == torch.unique +
    adds, bit for bit, on overlapping, disjoint, empty, identical and one-sided inputs (every lane boundary case:
    fewer rows than lanes, ids 0 and top - 1)."""
    from zen.rows import merge_rows

    g = torch.Generator().manual_seed(width * 31 + VALUE_DTYPES.index(dtype))
    top = 5000
    cases = [(_sorted_rows(na, top, width, dtype, index_dtype, g), _sorted_rows(nb, top, width, dtype, index_dtype, g))
             for na, nb in ((0, 0), (0, 7), (3, 0), (1, 1), (2, 5), (1000, 1000), (4000, 30), (30, 4000))]
    same = _sorted_rows(500, top, width, dtype, index_dtype, g)
    cases.append((same, (same[0], same[1].flip(0))))
    cases.append(((torch.tensor([0, top - 1], dtype=index_dtype), same[1][:2]),
                  (torch.tensor([0, 1, top - 1], dtype=index_dtype), same[1][:3])))
    # the vector merge's cases: inputs taking turns row by row, one wholly below the other, twins on every
    # 16-row block's edges (an id's two rows leave the network in two blocks)
    ids = torch.arange(2 * top, dtype=index_dtype)
    values = (torch.randn(2 * top, width, generator=g) + 0.25).to(dtype)
    cases.append(((ids[0::2], values[0::2]), (ids[1::2], values[1::2])))
    cases.append(((ids[:700], values[:700]), (ids[700:1500], values[700:1500])))
    cases.append(((ids[:1000], values[:1000]), (ids[15:1000:16], values[15:1000:16])))
    cases.append(((ids[16:3000:16], values[16:3000:16]), (ids[:3000:3], values[:3000:3])))
    for a, b in cases:
        fast = merge_rows(a, b)
        with native.disabled():
            ref = merge_rows(a, b)
        assert fast[0].dtype == index_dtype and torch.equal(fast[0], ref[0].to(index_dtype))
        assert torch.equal(fast[1].view(torch.uint8), ref[1].view(torch.uint8))
        room = (torch.full((a[0].numel() + b[0].numel() + 3,), -7, dtype=index_dtype),
                torch.full((a[0].numel() + b[0].numel() + 3, width), 5.0, dtype=dtype))
        into = merge_rows(a, b, room)  # written into the room it was given (a reused buffer), the same union
        for got, given in zip(into, room, strict=True):
            assert got.untyped_storage().data_ptr() == given.untyped_storage().data_ptr()
        assert torch.equal(into[0], fast[0]) and torch.equal(into[1].view(torch.uint8), fast[1].view(torch.uint8))
    with pytest.raises(RuntimeError, match="ascending and distinct"):
        ext.merge_rows(torch.tensor([5, 3]), torch.ones(2, 1), torch.tensor([4]), torch.ones(1, 1))
    rooms = ((torch.empty(2, dtype=torch.long), torch.empty(2, 1)),  # too small
             (torch.empty(3, dtype=torch.int), torch.empty(3, 1)),  # another dtype
             (torch.empty(3, dtype=torch.long), torch.empty(3, 2)))  # another width
    for room in rooms:
        with pytest.raises(RuntimeError, match="room"):
            ext.merge_rows(torch.tensor([1, 3]), torch.ones(2, 1), torch.tensor([4]), torch.ones(1, 1), *room)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("width", [1, 4])
def test_put_rows_matches_reference(ext: ModuleType, dtype: torch.dtype, width: int) -> None:
    from zen.rows import put_rows

    g = torch.Generator().manual_seed(9)
    for index_dtype in (torch.int32, torch.int64):
        ids, values = _sorted_rows(700, 3001, width, dtype, index_dtype, g)
        ids = ids[torch.randperm(ids.numel(), generator=g)]  # any order of distinct ids
        fast, ref = torch.full((3001, width), 7.0, dtype=dtype), torch.full((3001, width), 7.0, dtype=dtype)
        put_rows(fast, ids, values)
        with native.disabled():
            put_rows(ref, ids, values)
        assert torch.equal(fast.view(torch.uint8), ref.view(torch.uint8))
    with pytest.raises(RuntimeError, match="outside"):
        ext.put_rows(torch.zeros(10, 1), torch.tensor([3, 10]), torch.ones(2, 1))


STAGE_BYTES = 16384  # fill_sum's staging block (zen_cpu_write.cpp, kStageBytes)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("width", [1, 3, 1500, 8500])
def test_fill_sum_matches_reference(ext: ModuleType, dtype: torch.dtype, width: int) -> None:
    """The streamed result write == add_messages into a zeroed buffer, bit for bit: one set, several
    overlapping sets (added in list order), no sets, empty sets; over block edges (a block's rows, one more
    and one fewer, a partial last block), rows 0 and M - 1, rows wider than a block, and an output that starts
    mid-line."""
    from zen.rows import add_messages

    g = torch.Generator().manual_seed(width)
    block = max(1, STAGE_BYTES // (width * dtype.itemsize))
    for M in sorted({1, max(1, block - 1), block, block + 1, 3 * block + 5}):
        for index_dtype in (torch.int32, torch.int64):
            for sizes in ((0,), (1,), (min(M, 37),), (M,), (M // 2, 0, M // 3 + 1, M)):
                sets = [_sorted_rows(n, M, width, dtype, index_dtype, g) for n in sizes]
                for ids, _ in sets:
                    if ids.numel() >= 2:
                        ids[0], ids[-1] = 0, M - 1
                shift = int(sizes[0] == 1)  # a view one row into its buffer: its 64-byte lines start mid-row
                out = torch.full((M + shift, width), -3.0, dtype=dtype)[shift:]
                assert native.fill_sum(out, sets)
                ref = torch.zeros(M, width, dtype=dtype)
                add_messages(ref, sets)
                assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)), (M, sizes, index_dtype)
                if dtype in (torch.float32, torch.float64):  # the mean, as div_ computes it
                    assert native.fill_sum(out, sets, 3)
                    assert torch.equal(out.view(torch.uint8), ref.div(3).view(torch.uint8)), (M, sizes, "/ 3")
                else:  # half types: the caller divides
                    assert not native.fill_sum(out, sets, 3)
    out = torch.ones(5, 1)
    assert native.fill_sum(out, []) and not out.any()
    for bad in ([3, 2], [1, 1], [0, 10], [-1, 2]):  # unsorted, repeated, out of range
        with pytest.raises(RuntimeError, match="ascending, distinct"):
            ext.fill_sum(torch.zeros(10, 1), [torch.tensor(bad)], [torch.ones(2, 1)], 1)
    wide = torch.arange(5000)  # the checks also hold across blocks and across the chunks threads take
    for bad in (torch.cat([wide[:4000], wide[3990:4990]]), torch.cat([wide[:4999], torch.tensor([5000])])):
        with pytest.raises(RuntimeError, match="ascending, distinct"):
            ext.fill_sum(torch.zeros(5000, 1), [bad], [torch.ones(bad.numel(), 1)], 1)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("width", [1, 3])
def test_interleaved_shards_match_reference(ext: ModuleType, k: int, width: int) -> None:
    """Two-level sync's sparse node steps: split_interleaved == a mask and gathers per shard (row r to shard
    r % k as r // k, input order kept), and fill_sum with stride k writes the shards' ids as rows id * k + j,
    bit for bit like the mapped ids; both refuse bad ids."""
    g = torch.Generator().manual_seed(k * 10 + width)
    for index_dtype in (torch.int32, torch.int64):
        for n, M in ((0, 50), (1, 50), (300, 1000), (5000, 5003)):
            ids, values = _sorted_rows(n, M, width, torch.float32, index_dtype, g)
            offsets, local, grouped = native.split_interleaved(ids, values, k)
            bounds = offsets.tolist()
            assert bounds[0] == 0 and bounds[-1] == n and local.dtype == index_dtype
            shards = []
            for j in range(k):
                mine = ids.long() % k == j
                shard_ids, shard_values = local[bounds[j] : bounds[j + 1]], grouped[bounds[j] : bounds[j + 1]]
                assert torch.equal(shard_ids.long(), ids.long()[mine] // k) and torch.equal(shard_values, values[mine])
                shards.append((shard_ids, shard_values))
            for divisor in (1, 3):
                fast, ref = torch.full((M, width), 7.0), torch.full((M, width), 7.0)
                assert native.fill_sum(fast, shards, divisor, stride=k)
                assert native.fill_sum(ref, [(i.long() * k + j, v) for j, (i, v) in enumerate(shards)], divisor)
                assert torch.equal(fast.view(torch.uint8), ref.view(torch.uint8)), (index_dtype, n, M, divisor)
    with pytest.raises(RuntimeError, match="< 0"):
        ext.split_interleaved(torch.tensor([3, -1]), torch.ones(2, 1), 2)
    if k > 1:  # shard k - 1's last id lands past the output
        with pytest.raises(RuntimeError, match="ascending, distinct"):
            ext.fill_sum(torch.zeros(10, 1), [torch.tensor([0]), torch.tensor([10 // k])], [torch.ones(1, 1)] * 2, 1,
                         k, [0, k - 1])


def test_disabled_and_failed_build_fall_back(ext: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with native.disabled():
        assert native.get("cpu") is None
        assert native.nonzero_rows(torch.ones(3, 1)) is None
    assert native.get("meta") is None

    def broken(kind: str, verbose: bool = False) -> ModuleType:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr("zen.native.build.load_extension", broken)
    with caplog.at_level(logging.WARNING, logger="zen.native"):
        assert native.get("cpu") is None
        assert native.get("cpu") is None
        t = torch.zeros(100)
        t[3] = 1
        assert zen.simulate("zen-bp", [t, t]).outputs[0][3] == 2  # torch-op path still works
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "no compiler here" in warnings[0].getMessage()


def test_cpu_build_flags_follow_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    from zen.native import build

    monkeypatch.setenv("CXX", "false")  # a "compiler" that rejects everything: portable flags
    assert build.cpu_cflags() == []
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert build.cpu_cflags() == []
    assert len(build.host_cpu_tag()) == 10 and build.host_cpu_tag() == build.host_cpu_tag()


def test_kernels_bench_cli(ext: ModuleType, tmp_path, capsys: pytest.CaptureFixture) -> None:
    from zen.cli import main

    out = tmp_path / "rows.json"
    assert main(["kernels-bench", "--numel", "65536", "--repeats", "1", "--json", str(out)]) == 0
    assert main(["kernels-bench", "--numel", "65536", "--repeats", "1", "--sweep", "k", "--values", "1", "3"]) == 0
    assert main(["kernels-bench", "--numel", "65536", "--repeats", "1", "--servers", "4"]) == 0  # BP's CPU rows
    text = capsys.readouterr().out
    assert "extract + hash" in text and "hash, k=3" in text and out.exists()
    assert "BP pull: decode + write" in text and "BP server: sum + encode" in text and "BP push: partition" in text
    assert "HC ids: gap encode" in text and "HC ids: gap decode" in text and "HC merge: two halves" in text
    assert "result write: four sets" in text


@pytest.mark.slow
def test_cuda_kernels_compile_with_nvcc(nvcc_check: Future | None) -> None:
    if nvcc_check is None:
        pytest.skip("nvcc not found")
    outcome = nvcc_check.result(timeout=600)
    assert outcome.ok, outcome.message


def test_sweep_threshold_refuses_what_it_cannot_sweep(ext: ModuleType) -> None:
    """Mismatched sizes or dtypes are an error of the kernel; the wrapper leaves other dtypes to torch."""
    with pytest.raises(RuntimeError, match="one size and dtype"):
        ext.sweep_threshold(torch.zeros(10), torch.zeros(9), torch.zeros(10), 0.5, False)
    with pytest.raises(RuntimeError, match="one size and dtype"):
        ext.sweep_threshold(torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(10), 0.5, False)
    half = torch.zeros(10, dtype=torch.float16)
    assert native.sweep_threshold(half, half.clone(), half.clone(), 0.5, False) is None
    res, src, out = torch.tensor([0.5, -1.0, 0.0, 2.0]), torch.tensor([0.0, 0.25, 0.0, -3.0]), torch.empty(4)
    ids, values = ext.sweep_threshold(res, src, out, 0.5, False)
    assert ids.tolist() == [0, 1, 3] and values.tolist() == [0.5, -0.75, -1.0]
    assert res.tolist() == [0.0, 0.0, 0.0, 0.0] and out.tolist() == [0.5, -0.75, 0.0, -1.0]


def test_trim_largest_refuses_what_it_cannot_trim(ext: ModuleType) -> None:
    """k outside (0, candidates), ids outside the part or of another dtype, and NaN values are errors, before
    anything is written; the wrapper leaves other dtypes to torch."""
    res, out = torch.zeros(10), torch.zeros(10)
    ids, values = torch.tensor([1, 4, 7]), torch.tensor([3.0, -1.0, 2.0])
    for k in (0, 3):
        with pytest.raises(RuntimeError, match="0 < k < candidates"):
            ext.trim_largest(res, out, ids, values, k)
    with pytest.raises(RuntimeError, match="outside 10"):
        ext.trim_largest(res, out, torch.tensor([1, 4, 10]), values, 2)
    with pytest.raises(RuntimeError, match="int64 ids"):
        ext.trim_largest(res, out, ids.int(), values, 2)
    with pytest.raises(RuntimeError, match="NaN"):
        ext.trim_largest(res, out, ids, torch.tensor([3.0, float("nan"), 2.0]), 2)
    assert res.abs().sum() == 0
    half = torch.zeros(10, dtype=torch.float16)
    assert native.trim_largest(half, half.clone(), ids, values.half(), 2) is None
    out[ids] = values
    kept, sent = ext.trim_largest(res, out, ids, values, 2)
    assert kept.tolist() == [1, 7] and sent.tolist() == [3.0, 2.0]
    assert res.tolist()[4] == -1.0 and out.tolist()[4] == 0.0 and out.tolist()[1] == 3.0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gap_coding_matches_reference_and_round_trips(ext: ModuleType, dtype: torch.dtype) -> None:
    """The native gap coding gives the torch-op path's bytes, and both decode to the ids: gaps of one, 127,
    128 (the first two-byte code), 2^14 and beyond int32 (int64 ids only), an empty set and a lone id 0."""
    gen = torch.Generator().manual_seed(3)
    top = 2**31 - 1 if dtype == torch.int32 else 2**40
    cases = [torch.randperm(1 << 20, generator=gen)[:40_000].sort().values, torch.tensor([0, 1, 2, 130, 259, 16_643,
             top]), torch.tensor([], dtype=torch.int64), torch.tensor([0])]
    for ids in (c.to(dtype) for c in cases):
        codes = gaps.encode(ids)
        with native.disabled():
            assert torch.equal(gaps.encode(ids), codes)
            assert torch.equal(gaps.decode(codes, ids.numel(), top + 1, dtype), ids)
        assert codes.dtype == torch.uint8 and codes.numel() == gaps.nbytes(ids)
        assert torch.equal(gaps.decode(codes, ids.numel(), top + 1, dtype), ids)
    assert gaps.encode(torch.tensor([0, 1, 129, 257])).tolist() == [0, 0, 127, 127]
    assert gaps.encode(torch.tensor([128])).tolist() == [128, 1]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.9, 0.1), (0.5, 0.49), (0.0, 0.99)])
def test_gap_coding_of_mixed_code_lengths(ext: ModuleType, dtype: torch.dtype, mix: tuple[float, float]) -> None:
    """Streams whose codes are one, two and (rarely) three bytes in any order, so the 16-id blocks of the
    vector paths meet every mix, a long code anywhere in a block, and tails of every length: the torch-op
    path's bytes, and the ids back."""
    gen = torch.Generator().manual_seed(int(mix[0] * 100 + mix[1] * 10))
    for n in (15, 16, 17, 47, 5_003):
        u = torch.rand(n, generator=gen)
        small = torch.randint(0, 128, (n,), generator=gen)
        gap = torch.where(u < mix[0], small, torch.where(u < mix[0] + mix[1], small + 128 * torch.randint(
            1, 128, (n,), generator=gen), small + 16_384 * torch.randint(1, 64, (n,), generator=gen)))
        ids = ((gap + 1).cumsum(0) - 1).to(dtype)
        codes = gaps.encode(ids)
        with native.disabled():
            assert torch.equal(gaps.encode(ids), codes)
        assert torch.equal(gaps.decode(codes, n, int(ids[-1]) + 1, dtype), ids)
        with pytest.raises(ZenCommError):  # the last id one past the rows
            gaps.decode(codes, n, int(ids[-1]), dtype)
        with pytest.raises(ZenCommError):  # a byte left over
            gaps.decode(torch.cat([codes, codes[:1]]), n, int(ids[-1]) + 1, dtype)
        with pytest.raises(ZenCommError):  # one id more than the codes hold
            gaps.decode(codes, n + 1, int(ids[-1]) + 1, dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gap_codes_written_into_room(ext: ModuleType, dtype: torch.dtype) -> None:
    """Codes written into given room (HC's send, behind its values) are a view of its first bytes, the same
    bytes as fresh ones; room short of `room_bytes` is refused, whatever the codes would need."""
    ids = torch.randperm(1 << 16, generator=torch.Generator().manual_seed(5))[:3_000].sort().values.to(dtype)
    room = torch.full((gaps.room_bytes(3_000, dtype) + 7,), 255, dtype=torch.uint8)
    codes = gaps.encode(ids, room)
    assert codes.data_ptr() == room.data_ptr() and torch.equal(codes, gaps.encode(ids))
    with pytest.raises(RuntimeError, match="room"):
        ext.encode_gaps(ids, room[: gaps.room_bytes(3_000, dtype) - 1])


@pytest.mark.parametrize("at", [0, 5, 15, 16, 31, 40])
def test_gap_encoding_refuses_ids_out_of_order_anywhere(ext: ModuleType, at: int) -> None:
    """A repeated or falling id inside a 16-id block, or at its edges, is refused, not coded."""
    ids = torch.arange(0, 3 * 48, 3, dtype=torch.int32)
    for bad in (ids[at - 1] if at else -1, ids[at] - 5):
        broken = ids.clone()
        broken[at] = max(int(bad), 0) if at else 0
        if at == 0:
            broken[1] = 0
        with pytest.raises(RuntimeError, match="ascending"):
            ext.encode_gaps(broken)


@pytest.mark.parametrize("use_native", [True, False])
def test_gap_decoding_refuses_a_malformed_stream(ext: ModuleType, use_native: bool) -> None:
    """A peer's bytes that end inside a code, hold more or fewer codes than ids were sent, or name a row
    outside the result are a ZenCommError, on both paths."""

    bad = [([200], 1, 10), ([1, 2], 1, 10), ([1], 2, 10), ([9], 1, 9), ([], 1, 10), ([0], 0, 10)]
    for codes, count, rows in bad:
        with native.disabled() if not use_native else contextlib.nullcontext(), pytest.raises(ZenCommError):
            gaps.decode(torch.tensor(codes, dtype=torch.uint8), count, rows, torch.int32)
