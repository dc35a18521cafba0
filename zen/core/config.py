"""What every rank of a synchronization must agree on, frozen in one object: the scheme and its options, the
compressor, two-level nodes, the checks and what the caller knows of its parts. Its `code` is what a call's
headers carry (zen.comm.base), so ranks configured differently raise on every rank instead of summing wrong;
it is made here and nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zen.comm.base import code_of
from zen.twolevel import INTRA_MODES
from zen.types import ZenInputError

NONFINITE = ("pass", "raise")
Options = tuple[tuple[str, Any], ...] | Mapping[str, Any] | None


def frozen(options: Options) -> tuple[tuple[str, Any], ...]:
    """Keyword options as a sorted tuple: hashable, and printed alike on every rank."""
    if isinstance(options, tuple):
        return options
    return tuple(sorted((options or {}).items()))


@dataclass(frozen=True)
class SyncConfig:
    """One synchronization's settings (options given as a dict are frozen into sorted tuples).

    The scheme: `scheme` (zen.schemes()) with `options`. The compressor: `compress` (zen.compress) of
    `density` with `compress_options`, for the parts that are not the scheme's own (a DDP bucket's dense
    parameters), and with `compress_rows` for the scheme's parts too (embedding rows; every part of the
    functional API or of a hook without `sparse_params`). Two-level: `ranks_per_node` > 1 consecutive ranks
    form a node, `intra` its node steps (zen.twolevel); `flat_fallback`: a part two-level sync cannot take
    (a COO gradient, a sparse result, a compressed part) goes flat over all ranks (the hook's other parts)
    instead of being a ZenInputError (the functional API's one tensor). The checks: `validate` runs the
    cross-rank input check on the first two steps, then every `check_every` steps (0: never again; 1: every
    call), and every step with `nonfinite="raise"` (NaN / Inf an error there; "pass" sums them).
    `sizes_agreed`: every rank's tensors are known alike without a check (DDP's verified buckets), so a call
    without one sends no sizes. `rows`, `sparse_result`, `divisor`: how the functional API's tensor is seen
    and returned (zen.api). `extra`: what else the ranks must agree on (the hook's `average`)."""

    scheme: str = "zen"
    options: tuple[tuple[str, Any], ...] = ()
    compress: str | None = None
    density: float = 0.05
    compress_options: tuple[tuple[str, Any], ...] = ()
    compress_rows: bool = False
    ranks_per_node: int = 1
    intra: str = "auto"
    flat_fallback: bool = False
    validate: bool = True
    check_every: int = 1
    nonfinite: str = "raise"
    sizes_agreed: bool = False
    rows: bool = False
    sparse_result: bool = False
    divisor: int = 1
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("options", "compress_options", "extra"):
            object.__setattr__(self, name, frozen(getattr(self, name)))
        if self.nonfinite not in NONFINITE:
            raise ZenInputError(f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")
        if self.ranks_per_node < 1:
            raise ZenInputError(f"ranks_per_node must be >= 1 (1: flat), got {self.ranks_per_node}")
        if self.intra not in INTRA_MODES:
            raise ZenInputError(f"intra must be one of {INTRA_MODES}, got {self.intra!r}")
        if self.check_every < 0:
            raise ZenInputError(f"check_every must be >= 0 (0: never), got {self.check_every}")

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1

    def check_due(self, step: int) -> bool:
        """Whether the call of optimizer step `step` runs the cross-rank input check."""
        periodic = self.check_every > 0 and step % self.check_every == 0
        return self.validate and (step < 2 or periodic or self.nonfinite == "raise")

    def code(self, tag: object = None) -> int:
        """The header code of one call of this configuration (`tag`: what else names the call, e.g. the step
        and bucket, or the functional API's `tag=`)."""
        return code_of(f"{self!r}|tag={tag!r}")

    def but(self, **changes: Any) -> SyncConfig:
        return replace(self, **changes)
