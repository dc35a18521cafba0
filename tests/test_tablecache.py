"""BP's derived tables (S_j, bits, rank lookups) are held within a byte budget per device, visibly, and can be
let go: zen.tablecache behind zen.hashing's server_rows / server_bits / server_ranks."""

from __future__ import annotations

import pytest
import torch

from zen import hashing
from zen.tablecache import BUDGET_ENV, TableCache, nbytes

CPU = torch.device("cpu")


def test_bytes_count_tensors_inside_tuples_and_dataclasses() -> None:
    ranks = hashing.server_ranks(1000, 4, hashing.HashFamily.from_seed(1), CPU, 0)
    assert nbytes(ranks) == sum(t.numel() * t.element_size() for t in (ranks.bits, ranks.base, ranks.below))
    assert nbytes((torch.zeros(10, dtype=torch.int32), (3, 4))) == 40


def test_least_recently_used_tables_go_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUDGET_ENV, str(2500 / 2**20))  # 2500 bytes: two 1000-byte tables fit, not three
    cache, built = TableCache(), []

    def table(name: str) -> torch.Tensor:
        built.append(name)
        return torch.zeros(250, dtype=torch.int32)  # 1000 bytes

    for name in ("a", "b", "a", "c"):  # "a" used again: "b" is the least recent when "c" comes
        cache.get("cpu", name, lambda name=name: table(name))
    assert cache.usage() == {"cpu": (2, 2000)}
    cache.get("cpu", "a", lambda: table("a"))
    cache.get("cpu", "b", lambda: table("b"))
    assert built == ["a", "b", "c", "b"]  # "a" was kept, "b" rebuilt


def test_the_newest_table_stays_even_past_the_budget_and_devices_count_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUDGET_ENV, "0")
    cache = TableCache()
    cache.get("cpu", "x", lambda: torch.zeros(100))
    cache.get("cuda:0", "y", lambda: torch.zeros(10))  # another device's budget: x stays
    assert cache.usage() == {"cpu": (1, 400), "cuda:0": (1, 40)}
    cache.clear("cuda:0")
    assert cache.usage() == {"cpu": (1, 400)}
    cache.clear()
    assert cache.usage() == {}


def test_a_bad_budget_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        TableCache().get("cpu", "x", lambda: torch.zeros(1))


def test_hashing_tables_are_visible_and_clearable() -> None:
    hashing.TABLES.clear()
    family = hashing.HashFamily.from_seed(3)
    members, _ = hashing.server_rows(10_000, 4, family, CPU)
    assert hashing.server_rows(10_000, 4, family, CPU)[0] is members  # cached
    hashing.server_bits(10_000, 4, family, CPU)
    count, held = hashing.TABLES.usage()["cpu"]
    assert count == 2 and held == nbytes(members) + 4 * 8 * -(-10_000 // 64)
    hashing.TABLES.clear()
    assert hashing.TABLES.usage() == {} and hashing.server_rows(10_000, 4, family, CPU)[0] is not members
