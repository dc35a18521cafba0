"""Bad input gets a clear error in simulation and on the command line, never a hang."""

from __future__ import annotations

import pytest
import torch

import zen
from zen.cli import main


def test_unknown_scheme() -> None:
    with pytest.raises(zen.ZenInputError, match="unknown scheme 'nope'.*allreduce"):
        zen.simulate("nope", [torch.zeros(4)])


def test_bad_scheme_option() -> None:
    with pytest.raises(zen.ZenInputError, match="bad options"):
        zen.simulate("zen-bp", [torch.zeros(4)], not_an_option=1)
    with pytest.raises(ValueError, match="pull encoding"):
        zen.simulate("zen-bp", [torch.zeros(4)], pull="zip")


@pytest.mark.parametrize("scheme", zen.schemes())
def test_mismatch_and_nonfinite_raise_on_every_rank(scheme: str) -> None:
    cases = {
        "shape": [torch.zeros(10), torch.zeros(11), torch.zeros(10)],
        "dtype": [torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(10)],
        "nan": [torch.zeros(10), torch.tensor([float("nan")] * 10), torch.zeros(10)],
        "inf": [torch.full((10,), float("inf")), torch.zeros(10), torch.zeros(10)],
    }
    for name, tensors in cases.items():
        with pytest.raises(zen.ZenInputError, match="rank 1|rank 0"):
            zen.simulate(scheme, tensors, timeout_s=30)
        del name


def test_out_of_range_sparse_index() -> None:
    bad = torch.sparse_coo_tensor(torch.tensor([[0, 7]]), torch.ones(2), (5,), check_invariants=False)
    with pytest.raises(zen.ZenInputError, match="outside"):
        zen.simulate("zen", [bad, torch.zeros(5)])


def test_unsupported_dtype() -> None:
    with pytest.raises(zen.ZenInputError, match="unsupported dtype"):
        zen.simulate("zen", [torch.zeros(3, dtype=torch.int64)])


@pytest.mark.parametrize("argv, says", [
    (["bench", "--density", "1.5"], "density"), (["bench", "--schemes", "allreduce,nope"], "unknown scheme"),
    (["bench", "--pattern", "nope"], "pattern"), (["bench", "-n", "0"], "world-size"),
    (["bench", "--numel", "0"], "numel"), (["bench", "--repeats", "0"], "repeats"),
    (["bench", "--backend", "gloo", "--bandwidth", "0gbit"], "bandwidth"), (["bench", "--bandwidth", "1gbit"], "gloo"),
    (["scale", "--world-sizes", "1"], "world-sizes"),
    (["model", "-n", "6", "--ranks-per-node", "4", "--gamma-n", "2"], "must divide"),
    (["bench", "-n", "6", "--ranks-per-node", "4"], "must divide"),
    (["bench", "-n", "4", "--ranks-per-node", "0"], "ranks-per-node"),
    (["bench", "-n", "4", "--ranks-per-node", "2", "--flat"], "--flat"),
    (["bench", "--backend", "gloo", "-n", "4", "--flat"], "--flat"),
    (["bench", "--compress", "sign"], "sparsifier"), (["model", "--compress", "sign"], "sparsifier"),
])
def test_cli_bad_values_are_one_line_and_exit_2(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and says in err[-1] and "Traceback" not in "\n".join(err)


def test_cli_counts_accept_powers() -> None:
    from zen.cli_args import count

    assert count("2^20") == count("1048576") == count("1.048576e6") == 1 << 20


def test_out_overlapping_the_input_is_refused() -> None:
    """out may be the input itself (in place) or apart from it; a partial overlap would corrupt the input
    while it is read."""
    buf = torch.zeros(2001)
    buf[:1000:7] = 1.0
    with pytest.raises(zen.ZenInputError, match="overlaps"):
        zen.simulate("zen", [buf[:2000]], outs=[buf[1:]])
    square = torch.zeros(40, 40)
    with pytest.raises(zen.ZenInputError, match="overlaps"):
        zen.simulate("zen", [square.t()], outs=[square])


def test_sparse_rows_of_zero_width_are_refused() -> None:
    empty_rows = torch.sparse_coo_tensor(torch.tensor([[0, 3]]), torch.ones(2, 0), (5, 0), check_invariants=True)
    with pytest.raises(zen.ZenInputError, match="zero elements"):
        zen.simulate("zen", [empty_rows, empty_rows])


def test_the_check_announces_every_ranks_rows() -> None:
    """The input check carries the row count of each of the first ANNOUNCED parts, which schemes bound their
    messages by: every rank gets every rank's counts, a part whose rows are not extracted (or past ANNOUNCED) gets
    None, and a communicator forgets them when the next call begins."""
    from zen.comm.sim import SimComm, SimGroup
    from zen.grad import to_local_grad
    from zen.validate import ANNOUNCED, check_parts

    P = 3
    group = SimGroup(P, timeout_s=60)

    def rank_main(r: int) -> tuple[list[list[int] | None], bool, bool]:
        comm = SimComm(group, r, torch.device("cpu"))
        comm.begin_call(1)
        grads = []
        for k in range(ANNOUNCED + 1):
            t = torch.zeros(50)
            t[: r + k] = 1.0
            grads.append(to_local_grad(t))
            grads[-1].rows()
        lazy = to_local_grad(torch.ones(50))
        parts = [(g, (50,), "zen") for g in [grads[0], lazy, *grads[1:]]]
        counts = check_parts(parts, comm)
        comm.announce(grads[0], [9, 9, 9])
        kept = comm.announced(grads[0]) == [9, 9, 9] and comm.announced(grads[1]) is None
        comm.begin_call(2)
        return counts, kept, comm.announced(grads[0]) is None

    for counts, kept, forgotten in group.run(rank_main):
        assert counts[0] == [0, 1, 2] and counts[1] is None
        assert counts[2 : ANNOUNCED] == [[k, k + 1, k + 2] for k in range(1, ANNOUNCED - 1)]
        assert counts[ANNOUNCED:] == [None] * (len(counts) - ANNOUNCED) and len(counts) == ANNOUNCED + 2
        assert kept and forgotten


def test_announced_rows_keep_no_tensor_alive() -> None:
    """A communicator holds the grads whose rows were announced weakly: a caller's tensor is freed after its call."""
    import gc
    import weakref

    from zen.comm.sim import SimComm, SimGroup
    from zen.grad import to_local_grad

    comm = SimComm(SimGroup(1), 0, torch.device("cpu"))
    comm.begin_call(1)
    grad = to_local_grad(torch.ones(8))
    comm.announce(grad, [8])
    alive = weakref.ref(grad)
    assert comm.announced(grad) == [8]
    del grad
    gc.collect()
    assert alive() is None
