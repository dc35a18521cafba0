"""Baseline synchronization schemes, each one self-registering file: importing the package imports every module
in it, so a new baseline is one new file here (docs/CONTRIBUTING.md, "Adding a scheme")."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
