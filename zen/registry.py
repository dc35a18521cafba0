"""The scheme registry and contract: `Scheme` (what the synchronizer calls, what `predict` promises, how
figures show it), `SCHEMES` (zen.plugins.Registry over zen/algorithms/ and the `zen.schemes` entry-point group:
the harness registers its baselines there), `@register_scheme("name")`, `make_scheme`, `schemes()`."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.output import Output
from zen.plugins import Registry
from zen.types import PhaseBytes, SyncStats, WireLayout


class Scheme(Protocol):
    """A synchronization scheme: writes the sum over ranks into `out` on every rank (as row sets, or in its
    dense (M, D) buffer; zen.output), and predicts, from the ranks' non-zero row sets, the bytes each rank
    will receive per phase. `label` and `color` are how figures show it."""

    name: str
    label: str
    color: str
    sparse_input: bool

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None: ...

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]: ...


SCHEMES: Registry[Scheme] = Registry("scheme", ("zen.algorithms",), group="zen.schemes")
register_scheme = SCHEMES.register


def schemes() -> list[str]:
    """Names of every registered scheme (Zen's, and those of installed plugins such as the baselines)."""
    return SCHEMES.names()


def scheme_config(scheme: Scheme | str, options: dict[str, Any] | None = None) -> str:
    """A scheme's name and options as one string: what every rank of a call must agree on."""
    if isinstance(scheme, str):
        return f"{scheme}{sorted((options or {}).items())}"
    return getattr(scheme, "config", None) or scheme.name


def make_scheme(name: str, **options: Any) -> Scheme:
    scheme = SCHEMES.make(name, **options)
    scheme.config = scheme_config(name, options)
    return scheme
