"""Gradient compressors (zen.compress.base): one self-registering file per compressor. The registry imports
every module of this package at its first lookup, so a new compressor is one new file here (CONTRIBUTING.md,
"Adding a compressor"), and the tests parametrised over `compressors()` pick it up."""

from __future__ import annotations

from typing import Any

from zen.compress.base import Compressor, PartContext
from zen.plugins import Registry

COMPRESSORS: Registry[Compressor] = Registry("compressor", ("zen.compress",))
register_compressor = COMPRESSORS.register


def compressors() -> list[str]:
    """Names of every registered compressor."""
    return COMPRESSORS.names()


def sparsifiers() -> list[str]:
    """The compressors whose choice a scheme synchronizes (not a quantizer's codes)."""
    return [name for name in compressors() if not getattr(COMPRESSORS.get(name), "own_exchange", False)]


def make_compressor(name: str, density: float = 0.05, **options: Any) -> Compressor:
    """A new compressor (fresh residuals); unknown names and bad options are a ZenInputError."""
    return COMPRESSORS.make(name, density=density, **options)


__all__ = ["COMPRESSORS", "Compressor", "PartContext", "compressors", "make_compressor", "register_compressor",
           "sparsifiers"]
