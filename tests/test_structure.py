"""The house rules the code must keep: the library stands without the harness, its modules import each other
without cycles and only from their own layer or below (docs/CONTRIBUTING.md's table), and its internal functions
take few parameters."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zen

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ("baselines", "workloads", "workflow", "harness", "simulator", "scripts", "tests")


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted((ROOT / "zen").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def _imports(tree: ast.Module, top_only: bool, modules: dict[str, ast.Module] | None = None) -> set[str]:
    """What a module imports: `from a import b` is module a.b where that is a module, else a."""
    nodes = tree.body if top_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                names.add(sub if modules is not None and sub in modules else node.module)
    return names


@pytest.mark.slow
def test_importing_zen_loads_nothing_of_the_harness() -> None:
    code = ("import sys, zen; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HARNESS!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_zen_never_imports_the_harness() -> None:
    for name, tree in _modules().items():
        bad = sorted(m for m in _imports(tree, top_only=False) if m.split(".")[0] in HARNESS)
        assert not bad, f"{name} imports {bad}"


def test_zen_modules_import_each_other_without_cycles() -> None:
    modules = _modules()
    graph = {name: {m for m in _imports(tree, True, modules) if m in modules and m != name}
             for name, tree in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(name):], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def _layers() -> list[list[str]]:
    """docs/CONTRIBUTING.md's layer table, top to bottom: each layer's paths (a folder ends in /, `zen/*.py` is
    every top-level module no other row names)."""
    text = (ROOT / "docs" / "CONTRIBUTING.md").read_text()
    table = text[text.index("| layer | what | folders |"):].split("\n\n")[0].splitlines()[2:]
    return [re.findall(r"`([^`]+)`", row.rsplit("|", 2)[1]) for row in table]


def _layer_of(path: str, layers: list[list[str]]) -> int:
    """The layer a file belongs to: the longest path of the table that names it."""
    best, where = -1, -1
    for i, paths in enumerate(layers):
        for p in paths:
            hit = (path.startswith(p) if p.endswith("/") else path == p) or (
                p == "zen/*.py" and path.count("/") == 1 and path.startswith("zen/"))
            size = 0 if p == "zen/*.py" else len(p)
            if hit and size > best:
                best, where = size, i
    assert where >= 0, f"{path} is in no layer of docs/CONTRIBUTING.md"
    return where


def test_zen_modules_import_only_from_their_layer_or_below() -> None:
    layers, modules = _layers(), _modules()
    files = {}
    for path in (ROOT / "zen").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = str(path.relative_to(ROOT))
    up = sorted(f"{files[name]} imports {files[dep]}" for name, tree in modules.items()
                for dep in _imports(tree, False, modules)
                if dep in modules and _layer_of(files[dep], layers) < _layer_of(files[name], layers))
    assert not up, "imports from a lower layer back up: " + "; ".join(up)


def test_internal_functions_take_at_most_eight_parameters() -> None:
    """Options travel as one configuration (zen.core.SyncConfig), not through every signature; the public
    functions (zen.__all__) keep their keyword options."""
    too_many = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name not in zen.__all__:
                a = node.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                if len(params) > 8:
                    too_many.append(f"{name}.{node.name} ({len(params)})")
    assert not too_many, too_many


@pytest.mark.parametrize("folder", ["harness", "simulator", "baselines", "workloads", "workflow/scripts", "scripts"])
def test_harness_modules_and_functions_stay_small(folder: str) -> None:
    """A module a newcomer can hold: at most 500 lines a file and 60 a function in the harness's folders."""
    big = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 500:
            big.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                big.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}")
    assert not big, big


def test_the_synchronizer_takes_the_calls_data_and_never_asks_a_schemes_type() -> None:
    """Policy lives in the frozen SyncConfig and wrappers are schemes (zen/route.py): `run` gets a call's data
    only, and the synchronizer never branches on what a scheme is."""
    from inspect import signature

    from zen.core.synchronizer import Synchronizer

    assert list(signature(Synchronizer.run).parameters) == ["self", "parts", "tag", "divisor", "step"]
    tree = ast.parse((ROOT / "zen" / "core" / "synchronizer.py").read_text())
    asked = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("isinstance", "hasattr", "getattr")]
    assert not asked, f"zen/core/synchronizer.py asks a type or an attribute at lines {asked}"
