"""The GPU checks' rows: each check beside a negative control, a deliberately broken variant that the check must
reject. A check whose control passes cannot fail, so its row fails too; a control that breaks for another
reason (a crash, a rank that died) proves nothing, and its row fails as well.

A check (or control) is a callable returning a detail string, raising `CheckFailed` (`require`) when what it
measured is wrong; any other exception is an error of the check itself.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


class CheckFailed(AssertionError):
    """What a check measured is wrong (as opposed to the check itself erring)."""


def require(condition: bool, message: str) -> None:
    """CheckFailed(message) unless `condition` (an assert that `python -O` cannot remove)."""
    if not condition:
        raise CheckFailed(message)


class Once(Generic[T]):
    """`fn()` run at most once, its result or its exception kept: a check and its control read one launch."""

    def __init__(self, fn: Callable[[], T]):
        self._fn = fn
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def __call__(self) -> T:
        if not self._done:
            self._done = True
            try:
                self._value = self._fn()
            except Exception as exc:  # noqa: BLE001 - kept and raised again to every reader
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    detail: str
    control: str = "-"
    seconds: float = 0.0


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _control(control: Callable[[], str]) -> tuple[bool, str]:
    """(whether the control failed as it must, what the table says about it)."""
    try:
        detail = control()
    except CheckFailed as exc:
        return True, f"caught: {_short(exc).removeprefix('CheckFailed: ')}"
    except Exception as exc:  # noqa: BLE001 - a broken control is reported, never taken for a caught one
        traceback.print_exc()
        return False, f"broke, proves nothing: {_short(exc)}"
    return False, f"passed, so the check cannot fail: {detail}"


def run_row(name: str, check: Callable[[], str], control: Callable[[], str] | None = None) -> Row:
    """Run a check and its negative control; the row passes only if the check passes and the control fails."""
    start = time.perf_counter()
    try:
        detail, ok = check(), True
    except Exception as exc:  # noqa: BLE001 - every check runs; the table says which failed
        if not isinstance(exc, CheckFailed):
            traceback.print_exc()
        detail, ok = _short(exc), False
    said = "-"
    if control is not None:
        caught, said = _control(control)
        ok = ok and caught
    return Row(name, PASS if ok else FAIL, detail, said, time.perf_counter() - start)


def skipped(name: str, why: str) -> Row:
    return Row(name, SKIP, why)


def render(rows: list[Row]) -> str:
    """One markdown table: check, result, negative control, detail, seconds."""
    lines = ["| check | result | negative control | detail | s |", "|---|---|---|---|---|"]
    for r in rows:
        cells = (r.name, r.status, r.control, r.detail, f"{r.seconds:.0f}")
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def exit_status(rows: list[Row]) -> int:
    """0 when no row failed (skipped rows say why in the table), else 1."""
    return 1 if any(r.status == FAIL for r in rows) else 0
