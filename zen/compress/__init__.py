"""Gradient compressors (zen.compress.base): one self-registering file per compressor. Importing the package
imports every module in it, so a new compressor is one new file here (CONTRIBUTING.md, "Adding a
compressor"), and the tests parametrised over `compressors()` pick it up."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from zen.compress.base import Compressor, PartContext
from zen.types import ZenInputError

_FACTORIES: dict[str, Callable[..., Compressor]] = {}


def register_compressor(name: str) -> Callable[[type[Compressor]], type[Compressor]]:
    def deco(cls: type[Compressor]) -> type[Compressor]:
        if name in _FACTORIES:
            raise ValueError(f"compressor {name!r} registered twice")
        cls.name = name
        _FACTORIES[name] = cls
        return cls

    return deco


def compressors() -> list[str]:
    """Names of every registered compressor."""
    return sorted(_FACTORIES)


def sparsifiers() -> list[str]:
    """The compressors whose choice a scheme synchronizes (not a quantizer's own exchange)."""
    return [name for name in compressors() if not _FACTORIES[name].own_exchange]


def make_compressor(name: str, density: float = 0.05, **options: Any) -> Compressor:
    """A new compressor (fresh residuals); unknown names and bad options are a ZenInputError."""
    if name not in _FACTORIES:
        raise ZenInputError(f"unknown compressor {name!r}; choose one of: {', '.join(compressors())}")
    try:
        return _FACTORIES[name](density=density, **options)
    except TypeError as exc:
        raise ZenInputError(f"bad options for compressor {name!r}: {exc}") from exc


for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Compressor", "PartContext", "compressors", "make_compressor", "register_compressor", "sparsifiers"]
