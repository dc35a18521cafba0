"""The fold to a power of two (zen.fold.Fold) that HC and SparCML share: a consistent choreography."""

from __future__ import annotations

import pytest

from zen.fold import Fold


@pytest.mark.parametrize("P", [1, 2, 3, 5, 6, 7, 8, 12, 13, 64, 100])
def test_fold_pairs_ranks_and_peers(P: int) -> None:
    fold = Fold(P)
    assert fold.p2 <= P < 2 * fold.p2 and 1 << fold.levels == fold.p2
    sitters = [s for s, _ in fold.pairs]
    assert sorted(sitters + fold.active) == list(range(P))  # every rank sits out or takes part, once
    assert sitters == [r for r in range(P) if fold.sits_out(r)]
    for sitter, holder in fold.pairs:
        assert fold.partner(sitter) == holder and fold.partner(holder) == sitter
        assert fold.folded(sitter) and fold.folded(holder)
    for v, r in enumerate(fold.active):
        assert fold.vrank(r) == v and fold.real(v) == r
        for level in range(fold.levels):
            peer = fold.peer(v, level)
            assert peer != r and fold.peer(fold.vrank(peer), level) == r  # exchanges pair up
