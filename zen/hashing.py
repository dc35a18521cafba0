"""Hierarchical hashing (paper section 3, Algorithm 1): lossless, balanced, data-independent partitions.

Level 1, h0, alone decides the destination server of a row index, so the same index goes to the same
server on every rank. Level 2 places indices in a memory of n partitions, each a parallel region of
r1 slots (k probes, atomic claim) plus a serial region (atomic append); the serial region grows
instead of dropping anything. Slots store position + 1, so 0 means empty and index 0 is safe.

All hashes are 32-bit (murmur3 finaliser over a seeded multiply-add) computed with int64 torch ops
that never overflow, so the C++/CUDA kernels reproduce them bit for bit with uint32 arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zen import native
from zen.bits import set_bits
from zen.device import accelerated
from zen.tablecache import TableCache

MASK32 = 0xFFFFFFFF
MAX_ROWS = 1 << 32
TABLES = TableCache()  # S_j, its bits and rank lookups per tensor size: zen.tablecache (usage, clear)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32), split in 16-bit halves so int64 never overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


@dataclass(frozen=True)
class HashFamily:
    """Seeded hashes h0 (partition) and h1..hk (slot probes), identical on every rank for one seed."""

    seed: int
    coeffs: tuple[tuple[int, int], ...]

    @classmethod
    def from_seed(cls, seed: int, k: int = 3) -> HashFamily:
        state, coeffs = seed & 0xFFFFFFFFFFFFFFFF, []
        for _ in range(k + 1):
            state, z = _splitmix64(state)
            coeffs.append(((z & MASK32) | 1, z >> 32))  # odd multiplier, 32-bit offset
        return cls(seed, tuple(coeffs))

    @property
    def k(self) -> int:
        return len(self.coeffs) - 1

    def hash32(self, index: torch.Tensor, level: int) -> torch.Tensor:
        a, b = self.coeffs[level]
        x = index.to(torch.int64)
        return _fmix32((_mul32(x, a) + b) & MASK32)

    def h0(self, index: torch.Tensor, n: int) -> torch.Tensor:
        """Destination server in [0, n) (multiply-shift range reduction of the 32-bit hash)."""
        return (self.hash32(index, 0) * n) >> 32

    def probe(self, index: torch.Tensor, level: int, slots: int) -> torch.Tensor:
        return (self.hash32(index, level) * slots) >> 32


@dataclass
class Partitions:
    """Output of hierarchical hashing: input positions grouped by destination server."""

    order: torch.Tensor  # positions into the input index array, partition-major
    counts: list[int] | torch.Tensor  # rows per partition (on the accelerator path still on the device)
    serial: int  # how many rows fell through all k probes into a serial region (-1: not read)


def region_sizes(nnz: int, n: int, r1_factor: float = 2.0, r2_ratio: float = 0.1) -> tuple[int, int]:
    """Per-partition parallel (r1) and serial (r2) region sizes; r1 total = r1_factor * nnz (paper: 2)."""
    r1 = max(1, -(-int(r1_factor * nnz) // n))
    return r1, max(1, int(r1 * r2_ratio))


def hierarchical_hash(
    index: torch.Tensor, n: int, family: HashFamily, r1_factor: float = 2.0, r2_ratio: float = 0.1
) -> Partitions:
    """Algorithm 1 with torch ops: h0 picks the partition, k probes claim a slot, the rest append."""
    nnz = int(index.numel())
    dev = index.device
    if nnz == 0:
        return Partitions(torch.empty(0, dtype=torch.int64, device=dev), [0] * n, 0)
    r1, r2 = region_sizes(nnz, n, r1_factor, r2_ratio)
    if (fast := native.hierarchical_hash(index, n, family, r1, r2)) is not None:
        return Partitions(*fast)
    part = family.h0(index, n)
    table = torch.zeros(n * r1, dtype=torch.int64, device=dev)  # 0 = empty, else position + 1
    pending = torch.arange(nnz, device=dev)
    for level in range(1, family.k + 1):
        if pending.numel() == 0:
            break
        slot = part[pending] * r1 + family.probe(index[pending], level, r1)
        free = table[slot] == 0
        cand, cslot = pending[free], slot[free]
        table[cslot] = cand + 1  # racing writers: exactly one lands per slot
        won = table[cslot] == cand + 1
        pending = torch.cat([pending[~free], cand[~won]])
    serial_tab, spilled = _serial_append(pending, part, n, r2)
    layout = torch.cat([table.view(n, r1), serial_tab], dim=1)
    claimed = layout.view(-1)
    order = claimed[claimed != 0] - 1
    counts = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, part, torch.ones_like(part))
    return Partitions(order, counts if accelerated(dev) else counts.tolist(), spilled)


def _serial_append(pending: torch.Tensor, part: torch.Tensor, n: int, r2: int) -> tuple[torch.Tensor, int]:
    """Serial regions with an append counter per partition; a full region grows, never drops."""
    dev = pending.device
    spilled = int(pending.numel())
    if spilled == 0:
        return torch.zeros(n, r2, dtype=torch.int64, device=dev), 0
    p = part[pending]
    p_sorted, perm = torch.sort(p, stable=True)
    pos_sorted = pending[perm]
    counts = torch.bincount(p_sorted, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    append_at = torch.arange(spilled, device=dev) - starts[p_sorted]
    width = max(r2, spilled)  # an upper bound known without reading the counts
    tab = torch.zeros(n, width, dtype=torch.int64, device=dev)
    tab[p_sorted, append_at] = pos_sorted + 1
    return tab, spilled


def build_server_rows(num_rows: int, n: int, seed: int, device: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """S_j for every server, built now (not cached): what `server_rows` caches."""
    family = HashFamily.from_seed(seed)
    if (fast := native.server_rows(num_rows, n, family, device)) is not None:
        return fast
    dtype = torch.int32 if num_rows < 2**31 else torch.int64
    rows = torch.arange(num_rows, device=device, dtype=torch.int64)
    part = family.h0(rows, n).to(torch.int32)
    _, members = torch.sort(part, stable=True)
    counts = torch.bincount(part, minlength=n)
    offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return members.to(dtype), tuple(offsets.tolist())


def server_rows(
    num_rows: int, n: int, family: HashFamily, device: torch.device
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """S_j for every server j: all row ids with h0 = j, ascending, concatenated, with offsets.

    Fixed by h0 and the tensor size, so every rank computes it once and reuses it for decoding."""
    if num_rows >= MAX_ROWS:
        raise ValueError(f"tensors with >= 2^32 rows are not supported (got {num_rows})")
    return _server_rows_cached(num_rows, n, family.seed, str(device))


def _server_rows_cached(num_rows: int, n: int, seed: int, device: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    return TABLES.get(device, ("rows", num_rows, n, seed), lambda: build_server_rows(num_rows, n, seed, device))


def _server_bits_cached(num_rows: int, n: int, seed: int, device: str) -> torch.Tensor:
    return TABLES.get(device, ("bits", num_rows, n, seed),
                      lambda: membership_words(*_server_rows_cached(num_rows, n, seed, device), num_rows))


def membership_words(members: torch.Tensor, offsets: tuple[int, ...], num_rows: int) -> torch.Tensor:
    """(n, ceil(M / 64)) int64 words of servers whose rows are members[offsets[j] : offsets[j + 1]]: bit b of
    word w of row j is set iff row 64 w + b belongs to server j (any partition of the rows, hashed or ranges)."""
    n = len(offsets) - 1
    words = -(-num_rows // 64)
    packed = torch.zeros(n, words * 8, dtype=torch.uint8, device=members.device)
    for j in range(n):
        mine = members[offsets[j] : offsets[j + 1]].long()
        packed[j, : -(-num_rows // 8)] = set_bits(mine, num_rows)
    return packed.view(torch.int64)  # little-endian: bit b of word w is row 64 w + b


def server_bits(num_rows: int, n: int, family: HashFamily, device: torch.device) -> torch.Tensor:
    """Every S_j as membership words, (n, ceil(M / 64)) int64: bit b of word w of row j is set iff row 64 w + b
    has h0 = j. n M / 8 bytes, built once per tensor size: what a CPU pull decodes every server's hash bitmap
    with in one pass over the output, instead of reading S_j's member lists (4 bytes a row)."""
    if num_rows >= MAX_ROWS:
        raise ValueError(f"tensors with >= 2^32 rows are not supported (got {num_rows})")
    return _server_bits_cached(num_rows, n, family.seed, str(device))


def _popcount_below_table() -> torch.Tensor:
    """BELOW[8 * byte + k] = number of set bits of `byte` below bit k (2048 entries)."""
    return torch.tensor([bin(v & ((1 << k) - 1)).count("1") for v in range(256) for k in range(8)],
                        dtype=torch.int64)


@dataclass(frozen=True)
class ServerRanks:
    """Position of a row inside its server's S_j (the bit it owns in the hash bitmap), in O(1).

    A membership bit per row of the tensor plus the count of S_j members before each byte: 5/8 bytes
    per row, built once per tensor size. Lets a server encode from its few candidate rows instead of
    scanning all |S_j| = M / n rows of the aggregate (section 4's bitmap, same bits)."""

    bits: torch.Tensor  # uint8 (ceil(M / 8),): bit t of byte b set iff row 8b + t is in S_j
    base: torch.Tensor  # (ceil(M / 8),) int32 (int64 from 2^31 rows): members of S_j among rows < 8b
    below: torch.Tensor  # _popcount_below_table() on the device, in base's dtype

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """Positions in S_j of `rows`, which must all be members of S_j (dtype of `base`)."""
        rows = rows.to(self.base.dtype)
        byte = rows >> 3
        key = (self.bits.index_select(0, byte).to(rows.dtype) << 3) | (rows & 7)
        return self.base.index_select(0, byte) + self.below.index_select(0, key)


def _server_ranks_cached(num_rows: int, n: int, seed: int, device: str, server: int) -> ServerRanks:
    return TABLES.get(device, ("ranks", num_rows, n, seed, server),
                      lambda: _build_server_ranks(num_rows, n, seed, device, server))


def _build_server_ranks(num_rows: int, n: int, seed: int, device: str, server: int) -> ServerRanks:
    members, offsets = _server_rows_cached(num_rows, n, seed, device)
    return ranks_in(members[offsets[server] : offsets[server + 1]], num_rows)


def ranks_in(mine: torch.Tensor, num_rows: int) -> ServerRanks:
    """The row -> position lookup of one server whose rows are `mine` (ascending), any partition of the rows."""
    device = mine.device
    bits = set_bits(mine.long(), num_rows)
    dtype = torch.int32 if num_rows < 2**31 else torch.int64
    below = _popcount_below_table().to(device=device, dtype=dtype)
    counts = below[(bits.long() << 3) | 7] + (bits >> 7).to(dtype)  # popcount of every byte
    base = torch.cumsum(counts, 0, dtype=dtype) - counts
    return ServerRanks(bits, base, below)


def server_ranks(num_rows: int, n: int, family: HashFamily, device: torch.device, server: int) -> ServerRanks:
    """Row -> position in S_server lookup for one server (cached per tensor size, like `server_rows`)."""
    if num_rows >= MAX_ROWS:
        raise ValueError(f"tensors with >= 2^32 rows are not supported (got {num_rows})")
    return _server_ranks_cached(num_rows, n, family.seed, str(device), server)
