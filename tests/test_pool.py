"""The communicator's host buffer pool: reuse only what nothing views, fresh memory elsewhere."""

from __future__ import annotations

import pytest
import torch

from zen.comm.base import pack
from zen.comm.pool import MAX_BUFFERS, MAX_BYTES, MIN_BYTES, BufferPool, after, capacity, span

CPU = torch.device("cpu")


def test_an_idle_buffer_is_reused_and_a_viewed_one_is_not() -> None:
    pool = BufferPool()
    a = pool.take(MIN_BYTES * 3, CPU)
    a_ptr = a.data_ptr()
    b = pool.take(MIN_BYTES * 3, CPU)
    assert b.data_ptr() != a_ptr  # `a` is still alive
    kept = a[10:20].view(torch.int16)  # a view keeps the buffer busy after `a` goes
    del a
    assert pool.take(MIN_BYTES, CPU).data_ptr() not in (a_ptr, b.data_ptr())
    del kept
    c = pool.take(MIN_BYTES * 2, CPU)
    assert c.data_ptr() == a_ptr and c.numel() == MIN_BYTES * 2


def test_a_too_small_idle_buffer_is_replaced_not_kept() -> None:
    pool = BufferPool()
    del_me = pool.take(MIN_BYTES, CPU)
    del del_me
    big = pool.take(MIN_BYTES * 10, CPU)
    assert big.numel() == MIN_BYTES * 10
    assert pool.nbytes == capacity(MIN_BYTES * 10)


def test_small_and_device_buffers_are_not_pooled() -> None:
    pool = BufferPool()
    assert pool.take(MIN_BYTES - 1, CPU).numel() == MIN_BYTES - 1
    meta = pool.take(MIN_BYTES * 4, torch.device("meta"))
    assert meta.device.type == "meta" and pool.nbytes == 0


def test_the_pool_is_bounded_in_buffers_and_bytes() -> None:
    pool = BufferPool()
    held = [pool.take(MIN_BYTES, CPU) for _ in range(MAX_BUFFERS + 3)]
    assert len(held) == MAX_BUFFERS + 3 and pool.nbytes == MAX_BUFFERS * capacity(MIN_BYTES)
    big = BufferPool()
    first = big.take(MAX_BYTES // 2, CPU)
    second = big.take(MAX_BYTES // 2 + MIN_BYTES, CPU)  # past the byte bound: allocated, not kept
    assert first.numel() + second.numel() > MAX_BYTES and big.nbytes == capacity(MAX_BYTES // 2)


def test_capacity_leaves_at_most_an_eighth_of_headroom() -> None:
    for n in (1, 7, 8, 9, 1000, MIN_BYTES, MIN_BYTES + 1, 3 * MIN_BYTES + 5, 10**7):
        assert n <= capacity(n) <= n + n // 8 + 1


def test_room_for_rows_is_one_buffer_with_aligned_values() -> None:
    pool = BufferPool()
    like = torch.ones(4, 3, dtype=torch.float64)
    ids, values = pool.take_rows(10_000, torch.int32, like)
    assert ids.dtype == torch.int32 and ids.numel() == 10_000
    assert values.dtype == torch.float64 and values.shape == (10_000, 3) and values.data_ptr() % 64 == 0
    assert values.data_ptr() >= ids.data_ptr() + 4 * 10_000
    assert ids.untyped_storage().data_ptr() == values.untyped_storage().data_ptr()


def test_spare_room_after_a_row_set_holds_its_next_part_and_no_more() -> None:
    pool = BufferPool()
    like = torch.ones(1, 1)
    ids, values = pool.take_rows(10_000, torch.int32, like, spare=500)
    union = values[:9_000]  # a merge wrote fewer rows than it had room for
    tail = after(union, 500 + 4 * 1_000)
    assert tail.dtype == torch.uint8 and tail.data_ptr() == union.data_ptr() + 4 * 9_000
    assert after(torch.ones(4)[:2], 8).numel() == 8
    with pytest.raises(ValueError, match="leave its storage"):
        after(torch.ones(4)[:2], 9)


def test_pack_sends_parts_that_lie_back_to_back_as_they_are() -> None:
    pool = BufferPool()
    buf = torch.arange(64, dtype=torch.float32)
    values, codes = buf[:10], buf[10:20].view(torch.uint8)
    whole = pack([(values, codes)], CPU, pool)
    assert whole.data_ptr() == values.data_ptr() and whole.numel() == 80
    assert torch.equal(whole, buf[:20].view(torch.uint8))
    assert span([values.view(torch.uint8), buf[30:40].view(torch.uint8)]) is None  # a gap between them
    apart = pack([(values, buf[30:40])], CPU, pool)  # copied, back to back
    assert apart.data_ptr() != values.data_ptr()
    assert torch.equal(apart, torch.cat([buf[:10], buf[30:40]]).view(torch.uint8))
