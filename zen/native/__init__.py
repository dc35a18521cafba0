"""Native C++ / CUDA kernels for the hot paths of balanced parallelism, loaded lazily.

Non-zero extraction, hierarchical hashing (paper section 3), S_j and the hash bitmap (section 4) have
torch-op reference implementations in zen.types / zen.hashing / zen.encodings, and the row-set kernels
(merge, scatter, streamed dense sum) in zen.rows / LocalGrad.write_result, the gap coding of ascending ids in
zen.gaps, and the sparsifiers' threshold sweep in zen.compress.topk; these kernels produce the
same results (same partition membership, same bytes, same bits) much faster. `get(device)` returns the compiled
extension or None: ZEN_NATIVE=0 disables it, and a missing compiler or a failed build logs ONE warning
and leaves the torch-op path in charge. The first use builds the extension (~30 s, cached on disk;
`zen build` does it ahead of time).

Each wrapper returns None (False for the in-place writers `scatter_hash_bitmap`, `put_rows`, `fill_sum`)
when the native path does not apply, so callers dispatch with `if (fast := native.f(...)) is not None`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Protocol

import torch

from zen.device import accelerated


class HashFamily(Protocol):
    """What the kernels take of a zen.hashing.HashFamily: its (a, b) pair per level (the native layer sits
    below the hashing module, so it names the shape, not the class)."""

    coeffs: Sequence[tuple[int, int]]

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}

VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_LEVELS = 16  # h0 plus up to 15 probes (zen_common.h kMaxLevels)
MAX_CUDA_PARTITIONS = 1024  # S_j on CUDA keeps one cursor per partition per warp in shared memory


def enabled() -> bool:
    """False when ZEN_NATIVE is 0 / false / off (read on every call, so tests can flip it)."""
    return os.environ.get("ZEN_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def get(device: torch.device | str = "cpu") -> ModuleType | None:
    """The extension for `device` (built or loaded on first use, once per process), or None."""
    if not enabled():
        return None
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda") or (kind == "cpu" and accelerated(torch.device("cpu"))):
        return None  # the host under emulation takes the accelerator's torch-op path (zen.device)
    if kind not in _loaded:
        with _lock:
            if kind not in _loaded:
                _loaded[kind] = _load(kind)
    return _loaded[kind]


@contextmanager
def disabled() -> Iterator[None]:
    """Run the torch-op reference path inside this block (sets ZEN_NATIVE=0 for the process)."""
    old = os.environ.get("ZEN_NATIVE")
    os.environ["ZEN_NATIVE"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ZEN_NATIVE", None)
        else:
            os.environ["ZEN_NATIVE"] = old


def _load(kind: str) -> ModuleType | None:
    from zen.native.build import load_extension

    try:
        return load_extension(kind)
    except Exception as exc:  # any build or load failure means: fall back, never break a sync
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        _log.warning(
            "zen native %s kernels unavailable (%s: %s); every sync of this process uses the torch-op path "
            "instead (same results, slower). `zen build --verbose` retries the build and shows the compiler "
            "output; ZEN_NATIVE=0 skips native kernels.", kind, type(exc).__name__, reason)
        return None


def _run(ext: ModuleType, name: str, device: torch.device, *args: Any) -> Any:
    """Calls ext.name(*args); CUDA kernels also get the current stream and run on `device`."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return getattr(ext, name)(*args, torch.cuda.current_stream(device).cuda_stream)
    return getattr(ext, name)(*args)


def _coeffs(family: HashFamily) -> tuple[list[int], list[int]]:
    return [a for a, _ in family.coeffs], [b for _, b in family.coeffs]


def nonzero_rows(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ascending int64 ids of the non-zero rows, their rows) of an (M, D) block, one pass."""
    if dense.dim() != 2 or dense.dtype not in VALUE_DTYPES or (ext := get(dense.device)) is None:
        return None
    return _run(ext, "nonzero_rows", dense.device, dense)


def hierarchical_hash(
    index: torch.Tensor, n: int, family: HashFamily, r1: int, r2: int
) -> tuple[torch.Tensor, list[int], int] | None:
    """Algorithm 1 over `index`: (positions grouped by partition, rows per partition, serial rows). The CUDA
    kernel learns its sizes with one host synchronization of its own and returns the counts on the host."""
    if (index.dim() != 1 or index.dtype not in INDEX_DTYPES or len(family.coeffs) > MAX_LEVELS
            or index.numel() >= 2**31 or (ext := get(index.device)) is None):
        return None
    a, b = _coeffs(family)
    order, counts, serial = _run(ext, "hierarchical_hash", index.device, index, n, a, b, r1, r2)
    return order, counts.tolist(), int(serial)


def partition_rows(index: torch.Tensor, values: torch.Tensor, n: int, family: HashFamily, index_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """BP's push on the CPU: (ids as `index_dtype`, their rows, rows per server) grouped by h0, in input order
    inside a server: the partitions of Algorithm 1 without the slot claims that only order a partition."""
    if (index.dim() != 1 or index.dtype not in INDEX_DTYPES or index.device.type != "cpu" or values.dim() != 2
            or values.dtype not in VALUE_DTYPES or index_dtype not in INDEX_DTYPES
            or len(family.coeffs) > MAX_LEVELS or (ext := get("cpu")) is None):
        return None
    a, b = _coeffs(family)
    ids, rows, counts = ext.partition_rows(index, values, n, a, b, index_dtype == torch.int32)
    return ids, rows, counts.tolist()


def server_rows(
    num_rows: int, n: int, family: HashFamily, device: torch.device | str
) -> tuple[torch.Tensor, tuple[int, ...]] | None:
    """S_j of every server (rows with h0 = j, ascending), concatenated, with offsets."""
    device = torch.device(device)
    if num_rows >= 2**32 or (device.type == "cuda" and n > MAX_CUDA_PARTITIONS) or (ext := get(device)) is None:
        return None
    a, b = _coeffs(family)
    wide = num_rows >= 2**31
    if device.type == "cuda":
        like = torch.empty(0, device=device)
        members, offsets = _run(ext, "server_rows", device, num_rows, n, a, b, wide, like)
    else:
        members, offsets = ext.server_rows(num_rows, n, a, b, wide)
    return members, tuple(offsets.tolist())


def hash_values(index: torch.Tensor, family: HashFamily) -> torch.Tensor | None:
    """(k + 1, N) int64: hash32 of every index at every level, to check against HashFamily.hash32."""
    if index.dim() != 1 or index.dtype not in INDEX_DTYPES or (ext := get(index.device)) is None:
        return None
    return _run(ext, "hash_values", index.device, index, *_coeffs(family))


def _bitmap_ok(members: torch.Tensor, *tensors: torch.Tensor) -> bool:
    return members.dim() == 1 and members.dtype in INDEX_DTYPES and all(t.device == members.device for t in tensors)


def encode_hash_bitmap(out: torch.Tensor, members: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(hash bitmap over `members`, the non-zero rows of out[members] in order)."""
    if out.dim() != 2 or out.dtype not in VALUE_DTYPES or not _bitmap_ok(members, out):
        return None
    if (ext := get(out.device)) is None:
        return None
    return _run(ext, "encode_hash_bitmap", out.device, out, members)


def decode_hash_bitmap(payload: torch.Tensor, members: torch.Tensor) -> torch.Tensor | None:
    """members[t] for every set bit t of the payload, in order."""
    if payload.dtype != torch.uint8 or not _bitmap_ok(members, payload) or (ext := get(members.device)) is None:
        return None
    return _run(ext, "decode_hash_bitmap", members.device, payload, members)


def scatter_hash_bitmap(out: torch.Tensor, payload: torch.Tensor, members: torch.Tensor, values: torch.Tensor) -> bool:
    """out[members[t]] = next row of values for every set bit t (decode + put_rows in one pass)."""
    if (out.dim() != 2 or not out.is_contiguous() or out.dtype not in VALUE_DTYPES or values.dtype != out.dtype
            or payload.dtype != torch.uint8 or not _bitmap_ok(members, out, payload, values)):
        return False
    if (ext := get(out.device)) is None:
        return False
    _run(ext, "scatter_hash_bitmap", out.device, out, payload, members, values)
    return True


def merge_rows(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
               room: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Ascending union of two (ids, (n, D) values) row sets with ascending distinct ids; a + b on shared ids;
    written into `room` (ids, values) where given."""
    (a_idx, a_val), (b_idx, b_val) = a, b
    if (a_idx.dtype not in INDEX_DTYPES or a_val.dtype not in VALUE_DTYPES or a_idx.device.type != "cpu"
            or (ext := get(a_idx.device)) is None):
        return None
    return _run(ext, "merge_rows", a_idx.device, a_idx, a_val, b_idx, b_val, *(room or (None, None)))


def put_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> bool:
    """out[index] = values (distinct ids, (M, D) out); False when the native path does not apply."""
    if (out.dim() != 2 or not out.is_contiguous() or out.dtype not in VALUE_DTYPES or values.dtype != out.dtype
            or index.dtype not in INDEX_DTYPES or out.device.type != "cpu" or (ext := get(out.device)) is None):
        return False
    ext.put_rows(out, index, values)
    return True


def fill_sum(out: torch.Tensor, sets: list[tuple[torch.Tensor, torch.Tensor]], divisor: int = 1,
             stride: int = 1) -> bool:
    """out := the dense sum of (ids, (n, D) values) row sets with ascending distinct ids, added in list order,
    in one streaming pass, divided by `divisor` (fp32 / fp64 only; as out.div_(divisor) would); False when
    the native path does not apply. `stride` k > 1: the k sets are interleaved shards, set j's id i standing
    for row i * k + j (zen.twolevel)."""
    if divisor != 1 and out.dtype not in (torch.float32, torch.float64):
        return False
    if (out.dim() != 2 or not out.is_contiguous() or out.dtype not in VALUE_DTYPES or out.device.type != "cpu"
            or any(i.dtype not in INDEX_DTYPES or v.dtype != out.dtype for i, v in sets)
            or (ext := get(out.device)) is None):
        return False
    ids = [i for i, _ in sets]
    if len({i.dtype for i in ids}) > 1:
        ids = [i.long() for i in ids]
    ext.fill_sum(out, ids, [v for _, v in sets], divisor, stride, list(range(len(sets))) if stride > 1 else [])
    return True


def fill_hash_bitmap(out: torch.Tensor, messages: list[tuple[torch.Tensor, torch.Tensor]], bits: torch.Tensor,
                     divisor: int = 1) -> bool:
    """out := every server's hash-bitmap message (payload over S_j, values) decoded, in one streaming pass,
    divided by `divisor` (fp32 / fp64 only); `bits` (n, ceil(M / 64)) int64 says which rows each S_j holds
    (hashing.server_bits). False when the native path does not apply."""
    if divisor != 1 and out.dtype not in (torch.float32, torch.float64):
        return False
    if (out.dim() != 2 or not out.is_contiguous() or out.dtype not in VALUE_DTYPES or out.device.type != "cpu"
            or any(p.dtype != torch.uint8 or v.dtype != out.dtype for p, v in messages)
            or (ext := get(out.device)) is None):
        return False
    ext.fill_hash_bitmap(out, [p for p, _ in messages], [v for _, v in messages], bits, divisor)
    return True


def aggregate_hash_bitmap(received: list[tuple[torch.Tensor, torch.Tensor]], words: torch.Tensor, num_rows: int
                          ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A BP server's (hash bitmap over S_r, non-zero sums in S_r's order) from the (ids, values) pushed to it,
    summed message by message in the order given; S_r as membership words (a row of hashing.server_bits)."""
    if (not received or any(i.dtype not in INDEX_DTYPES or i.device.type != "cpu" or v.dtype not in VALUE_DTYPES
                            for i, v in received) or (ext := get("cpu")) is None):
        return None
    ids = [i for i, _ in received]
    if len({i.dtype for i in ids}) > 1:
        ids = [i.long() for i in ids]
    return ext.aggregate_hash_bitmap(ids, [v for _, v in received], words, num_rows)


def split_interleaved(ids: torch.Tensor, values: torch.Tensor, k: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(offsets[k + 1], shard ids, rows): row id r to interleaved shard r % k as r // k, shard s's rows at
    [offsets[s], offsets[s + 1]) in input order; one pass instead of a mask, a nonzero and two gathers per shard."""
    if (ids.dtype not in INDEX_DTYPES or values.dtype not in VALUE_DTYPES or values.dim() != 2
            or ids.device.type != "cpu" or (ext := get(ids.device)) is None):
        return None
    return ext.split_interleaved(ids, values, k)


def encode_gaps(ids: torch.Tensor, room: torch.Tensor | None = None) -> torch.Tensor | None:
    """zen.gaps.encode: ascending distinct ids >= 0 as LEB128 gaps (uint8), written at the start of `room` if given."""
    if ids.dtype not in INDEX_DTYPES or ids.dim() != 1 or ids.device.type != "cpu" or (ext := get(ids.device)) is None:
        return None
    return ext.encode_gaps(ids, room)


def decode_gaps(codes: torch.Tensor, count: int, rows: int, dtype: torch.dtype) -> torch.Tensor | None:
    """zen.gaps.decode: the `count` ids (< rows) of a gap-coded stream; RuntimeError if it is malformed."""
    if dtype not in INDEX_DTYPES or codes.device.type != "cpu" or (ext := get(codes.device)) is None:
        return None
    return ext.decode_gaps(codes, count, rows, torch.empty(0, dtype=dtype))


def sweep_threshold(res: torch.Tensor, src: torch.Tensor, out: torch.Tensor, threshold: float, strict: bool
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A sparsifier's threshold sweep in one pass: acc = res + src; elements with |acc| >= threshold (> when
    `strict`) go to `out` and leave `res`, the rest stay in `res` (zero in `out`); returns the chosen
    (ascending int64 ids, values). fp32 / fp64 contiguous 1-D CPU tensors only (`src` may be `out`)."""
    tensors = (res, src, out)
    if (any(t.dim() != 1 or not t.is_contiguous() or t.device.type != "cpu" or t.dtype != res.dtype
            or t.numel() != res.numel() for t in tensors) or res.dtype not in (torch.float32, torch.float64)
            or (ext := get(res.device)) is None):
        return None
    return ext.sweep_threshold(res, src, out, threshold, strict)


def trim_largest(res: torch.Tensor, out: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A sweep's chosen (ascending int64 ids, values) cut to the k largest |values| (ties: the lower ids);
    the others go back to `res` and become zero in `out`. Returns the kept (ids, values); 0 < k < len(ids)."""
    if (any(t.dim() != 1 or not t.is_contiguous() or t.device.type != "cpu" for t in (res, out, ids, values))
            or res.dtype not in (torch.float32, torch.float64) or out.dtype != res.dtype
            or values.dtype != res.dtype or ids.dtype != torch.int64 or (ext := get(res.device)) is None):
        return None
    return ext.trim_largest(res, out, ids, values, k)
