"""The verdict at the paper's setting for a measured claim that the simulation states under another name, or why no
simulation can give one: the one place such a claim is mapped, so the claims table has no blank verdict."""

from __future__ import annotations

import re

from claims import TOLERANCE, Claim, Frames, _row

# A measured claim (pattern) -> the simulated claim that judges it at the paper's setting, and why that one.
ALIASES: tuple[tuple[str, str, str], ...] = (
    (r"Fig 8 \(zipf pattern at [\d.]+%\): (?P<rest>.*)", "Fig 8 (NMT (gpt2) trace): {rest}",
     "judged on NMT's trace at Table 1's density: the paper's Fig 8 is NMT's, the synthetic pattern only stands in "
     "for it at this machine's scale"),
    (r"Fig 15 \(model\): (?P<name>\S+) Zen comm-time speedup over AllReduce",
     "Fig 15: {name} communication-time speedup of Zen over AllReduce",
     "the closed-form model's number at 16 x 8 GPUs judged by the step simulator's at the same cluster"),
)

# A measured claim (pattern) that no simulation can judge -> why.
REASONS: tuple[tuple[str, str], ...] = (
    (r"^Fig 18: |loss next to dense training",
     "a loss curve is the model's arithmetic, which the simulator does not run (it times messages); every scheme "
     "returns the same dense sum at any world size (tests: float64 reference at 1, 3 and >= 4 ranks), so at 128 "
     "GPUs Zen's loss differs from AllReduce's only in float summation order, as measured here"),
    (r"^Fig 16[ab]: ",
     "a kernel's speed on the paper's V100s needs the GPU itself (scripts/gpu_check.py times the CUDA kernels where "
     "a GPU is lent); the step simulator charges hashing at the paper's own rate (214M elements in ~6 ms, Fig 16)"),
    (r"PowerSGD",
     "PowerSGD's cost is its low-rank matrix products on the GPU, which the step simulator does not model; not a "
     "claim of the paper"),
    (r"^Fig 8: BP without index",
     "BP without its indices is no scheme the code runs, and the simulator replays only the real code's messages"),
    (r"^Cluster model against measurement: ",
     "the simulator's fidelity check (`make sim-fidelity`) trains lstm and dlrm only"),
)


def counterpart(claim: str, by: dict[str, list[Claim]]) -> tuple[list[Claim], str]:
    """The simulated rows that judge `claim` (its own, else an alias's, with the alias's reason) or, where there are
    none, why: ([], reason), ([], "") where nothing is mapped."""
    if claim in by:
        return by[claim], ""
    for pattern, target, why in ALIASES:
        hit = re.fullmatch(pattern, claim)
        if hit and target.format(**hit.groupdict()) in by:
            return by[target.format(**hit.groupdict())], why
    return [], next((why for pattern, why in REASONS if re.search(pattern, claim)), "")


def fidelity_claims(f: Frames) -> list[Claim]:
    """The cluster model's check on the emulated cluster, done by the step simulator: Zen's simulated step against
    its measured one at each workload's most ranks at 1 Gbit/s (the cells the default run's model is checked in)."""
    v = f.get("sim_fidelity")
    if v is None or v.empty or "workload" not in v:
        return []
    zen = v[(v["scheme"] == "zen") & (v["bandwidth"] == "1gbit")]
    rows = []
    for _, r in zen[zen["world_size"] == zen.groupby("workload")["world_size"].transform("max")].iterrows():
        error = r["simulated_ms"] / r["measured_ms"] - 1
        rows.append(_row(f"Cluster model against measurement: {r['workload']} Zen at {int(r['world_size'])} ranks",
                         "-", f"simulated {r['simulated_ms']:.0f} ms vs measured {r['measured_ms']:.0f} ms "
                         f"({error:+.0%})", f"the step simulator on the emulated cluster, {int(r['world_size'])} "
                         "ranks at 1gbit: Zen's whole step (sim_fidelity)",
                         "match" if abs(error) <= TOLERANCE else "short",
                         "the simulator prices the links, the messages' latency and the compute it was calibrated "
                         "with, and overlaps them as the hook does"))
    return rows


def not_simulated(reason: str) -> dict[str, str]:
    """The simulated columns of a claim no simulation can judge."""
    return {"sim": f"not simulated: {reason}", "sim_verdict": "n/a", "sim_why": ""}
