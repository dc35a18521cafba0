"""A byte-budgeted cache for the tables BP derives from h0 and a tensor's size (S_j, its membership bits, a
server's rank lookup), one budget per device.

Why not `functools.lru_cache`: the tables are device tensors of up to M rows, and a cache bounded by entry
count holds GPU memory that nobody sees (sixteen S_j of a large table pin gigabytes). Here every entry's bytes
are counted against its device's budget (`ZEN_TABLE_CACHE_MB`, read when an entry is added; 1024 by default),
the least recently used entries go first, `usage()` says what is held and `clear()` lets it go (e.g. before
`torch.cuda.empty_cache()`). The newest entry always stays, even past the budget: dropping it would rebuild
it on every call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

BUDGET_ENV = "ZEN_TABLE_CACHE_MB"
DEFAULT_BUDGET_MB = 1024

T = TypeVar("T")
_log = logging.getLogger(__name__)


def nbytes(value: Any) -> int:
    """Bytes of the tensors inside `value` (a tensor, or tuples / lists / dataclasses of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, tuple | list):
        return sum(nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


def budget_bytes() -> int:
    """The per-device budget from ZEN_TABLE_CACHE_MB (bytes); a bad value is a ValueError naming it."""
    raw = os.environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV} must be a number of megabytes, got {raw!r}") from None
    if mb < 0:
        raise ValueError(f"{BUDGET_ENV} must be >= 0, got {raw!r}")
    return int(mb * 2**20)


class TableCache:
    """Least-recently-used tables per device, bounded by bytes per device. Thread-safe (the hook's lanes
    share it); a table is built outside the lock, so two lanes may build the same one once each."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, Hashable], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, device: str, key: Hashable, build: Callable[[], T]) -> T:
        """The table of `key` on `device`, built by `build()` on a miss."""
        slot = (device, key)
        with self._lock:
            if slot in self._entries:
                self._entries.move_to_end(slot)
                return self._entries[slot][0]
        value = build()
        size = nbytes(value)
        with self._lock:
            self._entries[slot] = (value, size)
            self._entries.move_to_end(slot)
            self._evict(device, slot, budget_bytes())
        return value

    def _evict(self, device: str, keep: tuple[str, Hashable], budget: int) -> None:
        held = sum(size for (dev, _), (_, size) in self._entries.items() if dev == device)
        for slot in [s for s in self._entries if s[0] == device and s != keep]:
            if held <= budget:
                break
            held -= self._entries.pop(slot)[1]
            _log.debug("zen table cache: dropped %s on %s (budget %d bytes)", slot[1], device, budget)

    def usage(self) -> dict[str, tuple[int, int]]:
        """Per device: (tables held, their bytes)."""
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for (dev, _), (_, size) in self._entries.items():
                count, total = out.get(dev, (0, 0))
                out[dev] = (count + 1, total + size)
        return out

    def clear(self, device: str | None = None) -> None:
        """Drop every table (of `device` only, when given)."""
        with self._lock:
            for slot in [s for s in self._entries if device is None or s[0] == device]:
                del self._entries[slot]
