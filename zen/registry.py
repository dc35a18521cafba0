"""Scheme registry: the `Scheme` contract, `@register_scheme("name")` on a class; unknown names list the
choices."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.output import Output
from zen.types import PhaseBytes, SyncStats, WireLayout, ZenInputError


class Scheme(Protocol):
    """A synchronization scheme: writes the sum over ranks into `out` on every rank (as row sets, or in its
    dense (M, D) buffer; zen.output), and
    predicts, from the ranks' non-zero row sets, the bytes each rank will receive per phase."""

    name: str
    sparse_input: bool

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None: ...

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]: ...


_FACTORIES: dict[str, Callable[..., Scheme]] = {}
_PLUGINS = ("zen.bp", "zen.hc", "zen.selector", "baselines")


def register_scheme(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if name in _FACTORIES:
            raise ValueError(f"scheme {name!r} registered twice")
        cls.name = name
        _FACTORIES[name] = cls
        return cls

    return deco


def _load() -> None:
    for module in _PLUGINS:
        importlib.import_module(module)


def schemes() -> list[str]:
    """Names of every registered scheme (Zen's and the baselines)."""
    _load()
    return sorted(_FACTORIES)


def scheme_config(scheme: Scheme | str, options: dict[str, Any] | None = None) -> str:
    """A scheme's name and options as one string: what every rank of a call must agree on."""
    if isinstance(scheme, str):
        return f"{scheme}{sorted((options or {}).items())}"
    return getattr(scheme, "config", None) or scheme.name


def make_scheme(name: str, **options: Any) -> Scheme:
    _load()
    if name not in _FACTORIES:
        raise ZenInputError(f"unknown scheme {name!r}; choose one of: {', '.join(sorted(_FACTORIES))}")
    try:
        scheme = _FACTORIES[name](**options)
    except TypeError as exc:
        raise ZenInputError(f"bad options for scheme {name!r}: {exc}") from exc
    scheme.config = scheme_config(name, options)
    return scheme
