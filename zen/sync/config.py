"""What every rank of a synchronization must agree on, frozen in one object: the scheme and its options, the
compressor, two-level nodes and the checks. Its `code` is what a call's headers carry (zen.comm.base), so
ranks configured differently raise on every rank instead of summing wrong; it is made here and nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zen.comm.base import code_of
from zen.twolevel import INTRA_MODES
from zen.types import ZenInputError

NONFINITE = ("pass", "raise")


def frozen(options: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """Keyword options as a sorted tuple: hashable, and printed alike on every rank."""
    return tuple(sorted((options or {}).items()))


@dataclass(frozen=True)
class SyncConfig:
    """One synchronization's settings. `scheme` (zen.schemes()) with `options`; `compress` names a compressor
    (zen.compress) of `density` with `compress_options`, for dense parts and, with `compress_rows`, embedding
    rows too; `ranks_per_node` > 1: two-level sync over nodes of that many consecutive ranks, `intra` its node
    steps; `validate`: the cross-rank input check, `nonfinite="raise"` making NaN / Inf an error there;
    `rows`, `sparse_result`, `divisor`: how the functional API's tensor is seen and returned (zen.api)."""

    scheme: str = "zen"
    options: tuple[tuple[str, Any], ...] = ()
    compress: str | None = None
    density: float = 0.05
    compress_options: tuple[tuple[str, Any], ...] = ()
    compress_rows: bool = False
    ranks_per_node: int = 1
    intra: str = "dense"
    validate: bool = True
    nonfinite: str = "raise"
    rows: bool = False
    sparse_result: bool = False
    divisor: int = 1
    extra: tuple[tuple[str, Any], ...] = field(default=())  # what else the ranks must agree on (a hook's settings)

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE:
            raise ZenInputError(f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")
        if self.ranks_per_node < 1:
            raise ZenInputError(f"ranks_per_node must be >= 1 (1: flat), got {self.ranks_per_node}")
        if self.intra not in INTRA_MODES:
            raise ZenInputError(f"intra must be one of {INTRA_MODES}, got {self.intra!r}")

    @property
    def check_finite(self) -> bool:
        return self.nonfinite == "raise"

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1

    def code(self, tag: object = None) -> int:
        """The header code of one call of this configuration (`tag`: what else names the call, e.g. the step
        and bucket, or the functional API's `tag=`)."""
        return code_of(f"{self!r}|tag={tag!r}")

    def but(self, **changes: Any) -> SyncConfig:
        return replace(self, **changes)
