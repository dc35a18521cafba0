"""SparCML baseline: lossless and bit-identical on every variant, and bytes equal to its prediction."""

from __future__ import annotations

import pytest
import torch

import zen
from baselines.sparcml import VARIANTS, SparCML, Stream, StreamOps, choose_variant
from zen.types import WireLayout, ZenInputError

ALL = (*VARIANTS, "auto")
KINDS = ("random", "identical", "disjoint", "empty", "edges", "full", "filling")


def supports(kind: str, P: int, M: int, gen: torch.Generator) -> list[list[int]]:
    """Each rank's non-zero rows for one input pattern."""
    k = max(1, M // 20)

    def pick(n: int) -> list[int]:
        return torch.randperm(M, generator=gen)[:n].tolist()

    if kind == "identical":
        return [pick(k)] * P
    if kind == "disjoint":
        perm = torch.randperm(M, generator=gen).tolist()
        return [perm[r * k : (r + 1) * k] for r in range(P)]
    if kind == "empty":
        return [[] if r % 3 == 0 else pick(k) for r in range(P)]
    if kind == "edges":
        return [sorted({0, M - 1, *pick(k)}) for _ in range(P)]
    if kind == "full":
        return [list(range(M))] * P
    if kind == "filling":  # dense enough that the switch fires part-way through the reduction
        return [pick(3 * M // 10) for _ in range(P)]
    return [pick(k) for _ in range(P)]


def make_tensors(rows: list[list[int]], M: int, D: int, dtype: torch.dtype,
                 gen: torch.Generator) -> list[torch.Tensor]:
    """Dense vectors for D = 1, sparse COO (M, D) tensors (rows of width D) otherwise."""
    out = []
    for idx in rows:
        values = torch.randn(len(idx), D, generator=gen).clamp(-4, 4).to(dtype)
        values[values == 0] = 1
        index = torch.tensor(sorted(idx), dtype=torch.int64)
        if D == 1:
            out.append(torch.zeros(M, dtype=dtype).index_put_((index,), values.view(-1)))
        else:
            coo = torch.sparse_coo_tensor(index.view(1, -1), values, (M, D), check_invariants=True)
            out.append(coo.coalesce())
    return out


def check(result: zen.api.SimResult, tensors: list[torch.Tensor]) -> None:
    """Every output equals the float64 sum within recursive-summation error, and all match bitwise."""
    dense = [t.to_dense().double() for t in tensors]
    ref = torch.stack(dense).sum(0)
    bound = len(tensors) * torch.finfo(tensors[0].dtype).eps * torch.stack(dense).abs().sum(0)
    bits = torch.int16 if tensors[0].element_size() == 2 else torch.int32
    first = result.outputs[0].contiguous().view(bits)
    for out in result.outputs:
        assert out.shape == tensors[0].shape and out.dtype == tensors[0].dtype
        assert bool(((out.double() - ref).abs() <= bound).all())
        assert torch.equal(out.contiguous().view(bits), first)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ALL)
def test_lossless(variant: str, kind: str, P: int) -> None:
    gen = torch.Generator().manual_seed(P * 100 + KINDS.index(kind))
    M = 211
    tensors = make_tensors(supports(kind, P, M, gen), M, 1, torch.float32, gen)
    result = zen.simulate("sparcml", tensors, variant=variant)
    check(result, tensors)
    assert len({s.choice for s in result.stats}) == 1


@pytest.mark.parametrize("P", [3, 6])
@pytest.mark.parametrize("D", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_dtypes_and_row_width(variant: str, dtype: torch.dtype, D: int, P: int) -> None:
    gen = torch.Generator().manual_seed(7 * P + D)
    M = 97
    for kind in ("random", "filling"):
        tensors = make_tensors(supports(kind, P, M, gen), M, D, dtype, gen)
        check(zen.simulate("sparcml", tensors, variant=variant), tensors)


@pytest.mark.parametrize("variant", ALL)
def test_large_world(variant: str) -> None:
    gen = torch.Generator().manual_seed(64)
    M, P = 300, 64
    for kind in ("random", "empty"):
        tensors = make_tensors(supports(kind, P, M, gen), M, 1, torch.float32, gen)
        check(zen.simulate("sparcml", tensors, variant=variant), tensors)


# ---- bytes ---------------------------------------------------------------------------------

def measured(sets: list[list[int]], M: int, variant: str) -> tuple[zen.api.SimResult, dict[str, list[int]]]:
    gen = torch.Generator().manual_seed(len(sets))
    tensors = make_tensors(sets, M, 1, torch.float32, gen)
    result = zen.simulate("sparcml", tensors, variant=variant, validate=False)
    check(result, tensors)
    phases = {p: b for p, b in result.phases.items() if any(b)}
    return result, phases


@pytest.mark.parametrize("P", [4, 6, 8])
@pytest.mark.parametrize("kind", ["identical", "disjoint", "filling"])
@pytest.mark.parametrize("variant", ALL)
def test_bytes_match_prediction(variant: str, kind: str, P: int) -> None:
    M = 256
    sets = supports(kind, P, M, torch.Generator().manual_seed(P))
    result, phases = measured(sets, M, variant)
    index_sets = [torch.tensor(sorted(s), dtype=torch.int64) for s in sets]
    predicted = SparCML(variant).predict(index_sets, WireLayout(P, M))
    want = {p: [g.get(p, 0) for g in predicted] for p in set().union(*predicted)}
    assert phases == {p: b for p, b in want.items() if any(b)}
    switched = any(s.extra["dense_rows"] for s in result.stats)
    assert switched == (kind == "filling" or result.stats[0].choice == "dsar_split_allgather")


@pytest.mark.parametrize("P", [4, 8])
def test_bytes_closed_form(P: int) -> None:
    """The docstring's closed forms for identical and disjoint supports of k rows (no fold, no switch)."""
    M, row, levels = 256, 8, P.bit_length() - 1
    gen = torch.Generator().manual_seed(P)
    same = supports("identical", P, M, gen)
    k = len(same[0])
    _, rd = measured(same, M, "ssar_recursive_double")
    assert rd["reduce"] == [levels * k * row] * P
    _, sa = measured(same, M, "ssar_split_allgather")
    _, ds = measured(same, M, "dsar_split_allgather")
    for v in range(P):
        k_v = sum(v * M // P <= i < (v + 1) * M // P for i in same[0])
        sizes = 8 * (P - 2)  # stream sizes of the allgather's multi-stream messages (rounds 2..log2 P)
        assert sa["reduce_scatter"][v] + sa["allgather"][v] == ((P - 1) * k_v + k - k_v) * row + sizes
        assert ds["allgather"][v] == (M - M // P) * 4 + sizes
    _, rd = measured(supports("disjoint", P, M, gen), M, "ssar_recursive_double")
    assert rd["reduce"] == [(P - 1) * k * row] * P


@pytest.mark.parametrize("variant", ["auto", "ssar_recursive_double", "ssar_split_allgather"])
def test_fewer_bytes_than_agsparse_on_identical_supports(variant: str) -> None:
    P, M = 16, 1 << 16
    gen = torch.Generator().manual_seed(16)
    tensors = make_tensors(supports("identical", P, M, gen), M, 1, torch.float32, gen)
    ours = zen.simulate("sparcml", tensors, variant=variant)
    theirs = zen.simulate("agsparse", tensors)
    check(ours, tensors)
    assert max(ours.bytes_received) < min(theirs.bytes_received)


# ---- stream format and selection -------------------------------------------------------------

def test_dense_stream_travels_as_zero_ids_and_all_rows() -> None:
    ops = StreamOps(WireLayout(1, 13, width=2), torch.int32, torch.empty(0, 2))
    dense = Stream(10, 3, None, torch.arange(6.0).view(3, 2))
    sparse = Stream(10, 3, torch.tensor([11]), torch.ones(1, 2))
    alone = ops.encode([dense])
    assert [t.shape[0] for t in alone] == [0, 3]
    assert ops.decode(alone, 10, 3).index is None
    message = ops.encode([dense, sparse])  # several streams: all ids, all rows, then each stream's id count
    assert [t.shape[0] for t in message] == [1, 4, 2] and message[2].tolist() == [-1, 1]
    joined = ops.join(ops.bundle(alone), ops.bundle(ops.encode([sparse])))  # bundles join without host reads
    assert all(torch.equal(x, y) for x, y in zip(joined, message, strict=True))
    out = torch.zeros(13, 2)
    ops.write_bundle(out, message, [(10, 3), (10, 3)])  # a dense stream's rows are its range, a sparse one's its ids
    assert out[10:].tolist() == [[0.0, 1.0], [1.0, 1.0], [4.0, 5.0]] and not out[:10].any()
    assert ops.row_ids(message, [(10, 3), (10, 3)]).tolist() == [10, 11, 12, 11]  # the accelerator's write
    assert ops.merge(dense, sparse).values.tolist() == ops.merge(sparse, dense).values.tolist()


def test_auto_choice() -> None:
    def choice(counts: list[int], rows: int) -> str:
        return choose_variant(counts, WireLayout(len(counts), rows), small_bytes=1 << 16)

    assert choice([10, 0, 10], 10_000) == "ssar_recursive_double"
    assert choice([20_000] * 4, 1 << 22) == "ssar_split_allgather"
    assert choice([600] * 4, 1000) == "dsar_split_allgather"


def test_bad_variant() -> None:
    with pytest.raises(ZenInputError, match="variant"):
        zen.simulate("sparcml", [torch.ones(4)], variant="ring")
