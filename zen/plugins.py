"""Named factories of one kind, one generic type (`Registry`): Zen's schemes, compressors and pull encodings,
and the harness's workloads. A module registers its class with `@REGISTRY.register("name")`; the registry
imports the modules it is told about (every module of a package, so a new one is one new file) and the
packages other distributions name in its entry-point group (the reproduction harness registers its baselines
so), the first time a name is looked up. Unknown names list the choices. A leaf module: it imports nothing of
zen but the error type.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from zen.types import ZenInputError

T = TypeVar("T")
_log = logging.getLogger(__name__)


class Registry(Generic[T]):
    """Factories of one `kind`, found in `modules` (a package name: each of its modules) and in the
    entry-point group `group` (each entry names a module or package to import)."""

    def __init__(self, kind: str, modules: Sequence[str] = (), group: str | None = None):
        self.kind = kind
        self.modules = tuple(modules)
        self.group = group
        self._factories: dict[str, Callable[..., T]] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def register(self, name: str) -> Callable[[Any], Any]:
        """Class (or function) decorator: `name` makes it; a class gets `name` as its attribute."""

        def deco(factory: Any) -> Any:
            if name in self._factories and self._factories[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            if isinstance(factory, type):
                factory.name = name
            self._factories[name] = factory
            return factory

        return deco

    def load(self) -> None:
        """Import what registers (once): the named modules, every module of a named package, the plugins."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for name in self.modules:
                module = importlib.import_module(name)
                for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
                    importlib.import_module(f"{name}.{info.name}")
            for ep in entry_points(group=self.group) if self.group else ():
                try:
                    importlib.import_module(ep.value)
                except ImportError as exc:  # a plugin of a package not importable here (a wheel without the harness)
                    _log.debug("%s plugin %s (%s) not loaded: %s", self.kind, ep.name, ep.value, exc)

    def names(self) -> list[str]:
        self.load()
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., T]:
        if name not in self._factories:
            self.load()
        if name not in self._factories:
            raise ZenInputError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}")
        return self._factories[name]

    def make(self, name: str, **options: Any) -> T:
        """A new instance; unknown names and bad options are a ZenInputError."""
        factory = self.get(name)
        try:
            return factory(**options)
        except TypeError as exc:
            raise ZenInputError(f"bad options for {self.kind} {name!r}: {exc}") from exc
