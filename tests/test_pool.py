"""The communicator's host buffer pool: reuse only what nothing views, fresh memory elsewhere."""

from __future__ import annotations

import torch

from zen.comm.pool import MAX_BUFFERS, MAX_BYTES, MIN_BYTES, BufferPool, capacity

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
