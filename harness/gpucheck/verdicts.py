"""Verdicts of the GPU checks that read what the ranks returned (no trace, no thread): the hook against DDP's
allreduce, and the race probe (scripts/gpu_cases.py `race`)."""

from __future__ import annotations

from typing import Any

from harness.gpucheck.table import require


def judge_hook(ranks: list[dict[bool, dict[str, Any]]]) -> str:
    """Every rank's runs ({COO?: {"ddp": ..., "zen": ...}}): the hook's loss curve within 1e-4 of DDP's
    (relative to the first loss), its parameters within 1e-5 of DDP's, and alike on every rank."""
    worst = 0.0
    for sparse in sorted(ranks[0]):
        kind = "COO" if sparse else "dense"
        ref, ours = ranks[0][sparse]["ddp"], ranks[0][sparse]["zen"]
        require(len({r[sparse]["zen"]["checksum"] for r in ranks}) == 1, f"{kind}: parameters differ across ranks")
        diff = max(abs(a - b) for a, b in zip(ref["losses"], ours["losses"], strict=True))
        require(diff <= 1e-4 * max(1.0, abs(ref["losses"][0])), f"{kind}: loss curve differs from DDP's by {diff}")
        gap = abs(ref["checksum"] - ours["checksum"]) / max(1.0, abs(ref["checksum"]))
        require(gap <= 1e-5, f"{kind}: parameters differ from DDP's by {gap:.2e} (relative)")
        worst = max(worst, diff, gap)
    kinds = ", ".join("COO" if s else "dense" for s in sorted(ranks[0]))
    return f"{kinds}: largest loss / parameter difference {worst:.1e}"


def judge_race(probe: dict[str, Any]) -> str:
    """What DDP handed on after the lane's late writes equals the mean of the ranks' gradients. A probe that was
    never installed is an error (RuntimeError), not a failed check: it would prove nothing either way."""
    if probe.get("futures", 0) == 0:
        raise RuntimeError("the race probe was never used: the hook made no Future through "
                           "zen.ddp.hook.result_future (renamed? then scripts/gpu_cases.py must follow)")
    detail = (f"{probe['numel']:,} gradient elements, {probe['futures']} bucket results written late on the lane's "
              f"stream, largest difference {probe['worst']:.1e}")
    require(probe["wrong"] == 0, f"{probe['wrong']:,} elements differ from the ranks' mean ({probe['nan']:,} NaN: "
            f"read before the lane's stream wrote them); {detail}")
    return detail
