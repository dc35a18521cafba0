"""The paper's claims (spec zen.md section 6) next to the same metric measured by this pipeline.

Each check reads the aggregated frames and returns one row: claim, paper's number, ours, our setting,
verdict (match / beat / short / n/a) and why. A missing stage gives "n/a", never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

Frames = dict[str, pd.DataFrame]
Claim = dict[str, Any]

# Table 1 per-GPU densities; our workloads stand in for the paper's (GPT-2 for the NMT text model).
PAPER_DENSITY = {"lstm": ("LSTM", 0.0113), "dlrm": ("DeepFM", 0.0280), "gpt2": ("NMT", 0.0247),
                 "bert": ("BERT", 0.0106)}
PAPER_NAME = {w: name for w, (name, _) in PAPER_DENSITY.items()}
FIG8_LINES = ("allreduce", "agsparse", "sparcml", "omnireduce", "zen", "zen-bp")  # the paper's Fig 8 (BP = zen-bp)
PAPER_BERT_GAMMA_128 = 0.408 / 0.0106  # Fig 2b: BERT's density summed over 128 GPUs over one GPU's
# Fig 11, 16 machines, 25 Gbps: Zen's throughput over each baseline (GPT-2 stands in for NMT)
PAPER_FIG11 = {"lstm": {"allreduce": 3.1, "sparcml": 1.67, "omnireduce": 2.48}, "dlrm": {"omnireduce": 1.44},
               "gpt2": {"omnireduce": 1.51}}
# Fig 12, 100 Gbps: Zen's throughput over each baseline
PAPER_FIG12 = {"lstm": {"sparcml": 1.44}, "dlrm": {"omnireduce": 1.25}, "gpt2": {"omnireduce": 1.32}}
PAPER_FIG15 = {"lstm": 6.77, "dlrm": 2.10}  # Zen comm-time speedup over AllReduce
# Figs 13/14, LLMs with DGC top-5%, 25 Gbps: Zen's throughput over AllReduce and over OmniReduce
PAPER_FIG13 = {"allreduce": 2.0, "omnireduce": 1.6}
PAPER_FIG15_LLM = {"opt-2.7b": 3.44, "gemma2-2b": 3.51}  # Fig 15: Zen comm-time speedup over AllReduce, DGC 5%
LOSS_TOLERANCE = 0.05  # "within a few percent" of dense training's loss at the same step
TOLERANCE = 0.25  # within 25% of the paper's number counts as a match


def verdict(ours: float | None, paper: float, higher_is_better: bool = True) -> str:
    if ours is None or pd.isna(ours):
        return "n/a"
    if abs(ours - paper) <= TOLERANCE * abs(paper):
        return "match"
    return "beat" if (ours > paper) == higher_is_better else "short"


def _row(claim: str, paper: str, ours: str, setting: str, result: str, why: str) -> Claim:
    return {"claim": claim, "paper": paper, "ours": ours, "setting": setting, "verdict": result, "why": why}


def _missing(claim: str, paper: str, stage: str) -> Claim:
    return _row(claim, paper, "-", f"{stage} not run in this configuration", "n/a", "")


def density_claims(f: Frames) -> list[Claim]:
    s = f.get("sparsity")
    if s is None or s.empty:
        return [_missing("Table 1: per-GPU embedding-gradient density", "1.06-2.80%", "profile")]
    out = []
    for _, r in s.sort_values("workload").iterrows():
        name, paper = PAPER_DENSITY.get(r["workload"], (r["workload"], None))
        if paper is None:
            continue
        ratio = r["density"] / paper
        result = "match" if 0.5 <= ratio <= 2 else "short"
        out.append(_row(f"Table 1: {name} per-GPU density", f"{paper:.2%}", f"{r['density']:.2%}",
                        f"{r['workload']} preset {r['preset']}, batch {r['local_batch_size']}, {r['workers']} workers",
                        result, "same order of magnitude (within 2x)" if result == "match" else
                        "smaller vocabulary / batch than the paper's model changes the fraction of rows touched"))
        bert_at_128 = r["workload"] == "bert" and int(r["union_n"]) == 128
        sublinear = "match" if r["gamma_n"] < r["union_n"] else "short"
        out.append(_row(f"Fig 2b: {name} gamma^n grows sub-linearly", "BERT 1.06% -> 40.8% at 128 GPUs (gamma ~38)",
                        f"gamma^{int(r['union_n'])} = {r['gamma_n']:.2f} ({r['union_density']:.2%} after summing)",
                        f"{int(r['union_n'])} emulated workers",
                        verdict(r["gamma_n"], PAPER_BERT_GAMMA_128) if bert_at_128 else sublinear,
                        "overlapping non-zeros: the union is smaller than n x one worker's"))
    return out


def scale_claims(f: Frames) -> list[Claim]:
    """Fig 8's crossovers for every source: the synthetic pattern (NMT's density) and each workload's trace."""
    s = f.get("scale")
    if s is None or s.empty:
        return [_missing("Fig 8: comm time vs #GPUs", "only BP beats AllReduce at 128 GPUs", "scale")]
    s = s.assign(trace=s["source"].astype(str).str.endswith(".pt"))
    rows = []
    for (_, trace, density), cell in s.groupby(["source", "trace", s["density"].where(~s["trace"], -1.0)]):
        rows += _fig8_claims(cell, bool(trace), float(density))
    return rows


def _fig8_claims(cell: pd.DataFrame, trace: bool, density: float, simulated: str | None = None) -> list[Claim]:
    """One Fig 8 panel: where AGsparse crosses AllReduce, who beats AllReduce at the most GPUs, BP's time.
    The paper's -36% is NMT's (a trace of its stand-in, or the pattern at its density). `simulated`: the panel
    is `simulator fig8`'s, and this says how (its workload column names the trace); its claims are named as the
    measured panel's, so the report puts the two verdicts side by side."""
    source = str(cell["source"].iloc[0])
    workload = str(cell["workload"].iloc[0]) if simulated else Path(source).stem if trace else None
    n_max = int(cell["world_size"].max())
    at = cell[cell["world_size"] == n_max].set_index("scheme")["normalized"]
    if simulated:
        d_max = float(cell.loc[cell["world_size"].idxmax(), "density"])
        what = f"{PAPER_NAME.get(workload, workload)} ({workload}) trace"  # the measured claim's name
        setting = f"{simulated}; {workload} trace ({d_max:.2%} per GPU)"
    elif trace:
        d_max = float(cell.loc[cell["world_size"].idxmax(), "density"])
        what = f"{PAPER_NAME.get(workload, workload)} ({workload}) trace"
        setting = f"zen scale, {workload} trace (zen profile, {d_max:.2%} per GPU), exact bytes / 25 Gbps"
    else:
        what = f"{source} pattern at {density:.2%}"
        setting = f"zen scale, {source} pattern, density {density:.2%}, exact bytes / 25 Gbps"
    nmt = workload == "gpt2" if trace else abs(density / PAPER_DENSITY["gpt2"][1] - 1) < 0.01
    ag = cell[(cell["scheme"] == "agsparse") & (cell["normalized"] > 1)]["world_size"]
    cross = int(ag.min()) if len(ag) else None
    beaters = sorted(at[(at < 1) & at.index.isin(FIG8_LINES)].index)
    bp = at.get("zen-bp")
    only_bp = set(beaters) <= {"zen", "zen-bp"}  # zen picks BP or HC by itself
    judged = not simulated or nmt  # the paper's Fig 8 is NMT's: other traces at its setting are shown, not judged
    note = "" if judged else " (the paper's Fig 8 is NMT's only: shown, not judged)"
    rows = [
        _row(f"Fig 8 ({what}): AGsparse worse than AllReduce above ~40 GPUs", "~40 GPUs",
             f"from {cross} GPUs" if cross else f"never up to {n_max}", setting,
             "n/a" if not judged else "match" if cross and 16 <= cross <= 64 else "short",
             "all-gather traffic grows with n while AllReduce's stays ~2x the tensor; the crossover moves with "
             "the per-GPU density (n x d_G ~ 1)" + note),
        _row(f"Fig 8 ({what}): at {n_max} GPUs only BP beats AllReduce", "BP only",
             ", ".join(f"{b} {at[b]:.2f}x" for b in beaters) or "none", setting,
             "n/a" if n_max != 128 or not judged else "match" if only_bp and beaters else "short",
             ("as in the paper" if only_bp and beaters else "the others' time over AllReduce's at the most GPUs "
              "(the paper's Fig 8 lines only); below 1 they beat it: at this per-GPU density the union stays "
              "sparse enough for them") + note),
    ]
    if nmt and bp is not None:
        rows.append(_row(f"Fig 8 ({what}): BP's time at {n_max} GPUs", "0.64x AllReduce's (-36%, NMT)",
                         f"{bp:.2f}x", setting, verdict(bp, 0.64, higher_is_better=False) if n_max == 128 else "n/a",
                         "lower is better; BP's bytes follow the union density" +
                         ("" if trace else ": the synthetic zipf sets overlap more than NMT's")))
    if not trace and "bp-without-index" in at and bp:
        ratio = at["bp-without-index"] / bp
        rows.append(_row("Fig 8: BP without index = BP / 2", "0.5", f"{ratio:.2f}", setting,
                         verdict(ratio, 0.5, higher_is_better=False),
                         "index share of BP's payload depends on row width (values per index)"))
    return rows


def _ratio(df: pd.DataFrame, value: str, num: str, den: str) -> float | None:
    by = df.set_index("scheme")[value]
    return by[num] / by[den] if num in by and den in by and by[den] else None


def ratio_range(cell: pd.DataFrame, value: str, num: str, den: str) -> tuple[float, float, float] | None:
    """num / den of a training metric as (median ratio, lowest, highest): the range the two schemes'
    25th-75th percentile spreads allow (a bound at or below zero makes the range open-ended)."""
    by = cell.set_index("scheme")
    if num not in by.index or den not in by.index:
        return None
    n, d = by.loc[num], by.loc[den]
    if any(pd.isna(x[k]) for x in (n, d) for k in (value, f"{value}_lo", f"{value}_hi")):
        return None

    def div(a: float, b: float) -> float:
        return a / b if b > 0 else float("inf")

    return div(n[value], d[value]), div(n[f"{value}_lo"], d[f"{value}_hi"]), div(n[f"{value}_hi"], d[f"{value}_lo"])


def spread_verdict(r: tuple[float, float, float] | None, paper: float | None) -> str:
    """match / beat / short where the whole range falls on one side of (or within) the paper's number +-25%;
    "noisy" where the range straddles a boundary, so a rerun could flip it."""
    if r is None or paper is None:
        return "n/a"
    def region(x: float) -> str:
        return "match" if abs(x - paper) <= TOLERANCE * paper else ("beat" if x > paper else "short")
    lo, hi = region(r[1]), region(r[2])
    return lo if lo == hi else "noisy"


def _fmt_range(r: tuple[float, float, float] | None) -> str:
    if r is None:
        return "-"
    hi = "inf" if r[2] == float("inf") else f"{r[2]:.2f}"
    return f"{r[0]:.2f}x ({r[1]:.2f}-{hi})"


def _training_setting(cell: pd.DataFrame) -> str:
    r = cell.iloc[0]
    return (f"{r['workload']} {r['preset']}, {int(r['world_size'])} {r['backend']} ranks on one machine, "
            f"{r['bandwidth']}")


def training_claims(f: Frames) -> list[Claim]:
    """Per (workload, world size): Zen's throughput over the baselines the paper reports (Fig 11) and its
    communication-time speedup over AllReduce (Fig 15), each with the range the step-time spreads allow."""
    t = f.get("training")
    if t is None or t.empty:
        return [_missing("Fig 11: LSTM throughput", "3.1x over AllReduce", "train")]
    rows = []
    why = "a 2-core CPU box: ranks share the cores, so compute and local work weigh more than on the paper's GPUs"
    for (workload, _), cell in t.groupby(["workload", "world_size"], sort=True):
        setting = _training_setting(cell)
        name = PAPER_NAME.get(workload, workload)
        for base, paper in PAPER_FIG11.get(workload, {}).items():
            r = ratio_range(cell, "samples_per_s", "zen", base)
            rows.append(_row(f"Fig 11: {name} throughput, Zen over {base}", f"{paper}x (16 machines, 25 Gbps)",
                             _fmt_range(r), setting, spread_verdict(r, paper), why))
        rows.append(_best_row(cell, f"Zen has the highest throughput ({workload})", setting,
                              "the scheme with the highest median samples/s among all schemes of the run"))
        r = ratio_range(cell, "comm_ms", "allreduce", "zen")
        paper = PAPER_FIG15.get(workload)
        rows.append(_row(f"Fig 15: {name} communication-time speedup of Zen over AllReduce",
                         f"{paper}x" if paper else "-", _fmt_range(r), setting + "; exposed communication",
                         spread_verdict(r, paper), "communication = step time minus the no-communication step time"))
    steps = f.get("steps")
    if steps is not None and not steps.empty:
        pivot = steps[steps["scheme"].isin(["zen", "allreduce"])].pivot_table(
            index=["workload", "world_size", "step"], columns="scheme", values="loss")
        if {"zen", "allreduce"} <= set(pivot.columns):
            diff = float((pivot["zen"] - pivot["allreduce"]).abs().max())
            rows.append(_row("Fig 18: identical loss curves, Zen vs AllReduce", "identical",
                             f"max |loss difference| {diff:.2e}", f"{', '.join(sorted(steps['workload'].unique()))}",
                             "match" if diff < 1e-3 else "short",
                             "lossless: the sum differs from AllReduce's only in float summation order"))
    return rows


def _best_row(cell: pd.DataFrame, claim: str, setting: str, why: str) -> Claim:
    best = _best_scheme(cell)
    return _row(claim, "-", f"best: {best}" if best else "-", setting, best_verdict(cell, best),
                why + "; noisy where Zen's 25th-75th percentile range of samples/s overlaps the other's")


def best_verdict(cell: pd.DataFrame, best: str | None) -> str:
    """match where Zen's samples/s range lies above every other scheme's, short where the best scheme's
    lies above Zen's, else noisy (a rerun could flip which scheme is best)."""
    trained = cell[~cell["scheme"].isin(["none"])].set_index("scheme")
    if best is None or "zen" not in trained.index:
        return "n/a"
    zen = trained.loc["zen"]
    if best == "zen":
        others = trained.drop(index="zen")
        return "match" if others.empty or zen["samples_per_s_lo"] > others["samples_per_s_hi"].max() else "noisy"
    return "short" if trained.loc[best, "samples_per_s_lo"] > zen["samples_per_s_hi"] else "noisy"


def _best_scheme(cell: pd.DataFrame) -> str | None:
    trained = cell[~cell["scheme"].isin(["none"])]
    return None if trained.empty else str(trained.loc[trained["samples_per_s"].idxmax(), "scheme"])


def kernel_claims(f: Frames) -> list[Claim]:
    k = f.get("kernels")
    if k is None or k.empty:
        return [_missing("Fig 16: r1 = 2|G|d_G best", "r1 = 2", "kernels")]
    rows = []
    r1 = k[k["sweep"] == "r1"]
    if len(r1):
        best = r1.loc[r1["native_ms"].idxmin(), "r1_factor"]
        rows.append(_row("Fig 16a: hashing fastest at r1 = 2|G|d_G", "r1 = 2", f"r1 = {best:g}",
                         f"{r1['device'].iloc[0]}, {int(r1['nnz'].iloc[0]):,} non-zeros",
                         "match" if 1 <= best <= 2 else "short",
                         "smaller r1 sends more indices to the serial region; larger r1 costs memory traffic"
                         + ("" if 1 <= best <= 2 else "; on a shared CPU the differences are within timing noise")))
    kk = k[k["sweep"] == "k"].set_index("k")
    if 3 in kk.index and 4 in kk.index:
        ratio = kk.loc[3, "native_ms"] / kk.loc[4, "native_ms"]
        rows.append(_row("Fig 16b: k = 3 about as fast as k = 4", "~1.0", f"{ratio:.2f}", f"{kk['device'].iloc[0]}",
                         verdict(ratio, 1.0), "more probes shrink the serial region but cost a hash each"))
    return rows


def pull_claims(f: Frames) -> list[Claim]:
    p = f.get("pull")
    if p is None or p.empty:
        return [_missing("Fig 17b: hashing + COO speedup (LSTM)", "2.74x", "pull")]
    cell = p[(p["density"] - 0.0113).abs() < 1e-9]
    if cell.empty:
        cell = p[p["density"] == p["density"].iloc[0]]
    d = cell["density"].iloc[0]
    by = {(s, pl if isinstance(pl, str) else None): v for s, pl, v in
          zip(cell["scheme"], cell["pull"], cell["speedup_vs_allreduce"], strict=True)}
    coo, hb = by.get(("zen-bp", "coo")), by.get(("zen-bp", "hash_bitmap"))
    setting = f"zen bench sim, {int(cell['world_size'].iloc[0])} ranks, density {d:.2%}, bytes / 25 Gbps"
    rows = [_row("Fig 17b: hashing + COO speedup over AllReduce (LSTM)", "2.74x",
                 "-" if coo is None else f"{coo:.2f}x", setting, verdict(coo, 2.74),
                 "algorithmic (bytes only): no compute or latency, 8 ranks instead of 128")]
    if coo and hb:
        gain = hb / coo - 1
        rows.append(_row("Fig 17b: hash bitmap adds over COO (LSTM)", "+13%", f"{gain:+.0%}", setting,
                         verdict(gain, 0.13), "the bitmap pays off when the union is dense enough"))
    return rows


def compressed_claims(f: Frames) -> list[Claim]:
    """Figs 13/14 analogue: with a compressor on the sparse schemes, Zen's throughput over uncompressed dense
    AllReduce and over OmniReduce with the same compressor; PowerSGD side by side; and the loss after the
    compressor's warm-up against dense training at the same step."""
    t = f.get("compressed")
    if t is None or t.empty:
        return [_missing("Fig 13/14: LLM + DGC throughput", "~2.0-2.1x over AllReduce", "train_compressed")]
    rows = []
    for (workload, _), cell in t.groupby(["workload", "world_size"], sort=True):
        squeeze = f"{cell['compress'].dropna().iloc[0]} {100 * float(cell['density'].dropna().iloc[0]):g}%"
        setting = f"{_training_setting(cell)}; {squeeze} on the sparse schemes, AllReduce uncompressed"
        for base, paper in PAPER_FIG13.items():
            r = ratio_range(cell, "samples_per_s", "zen", base)
            rows.append(_row(f"Fig 13/14: Zen with {squeeze} over {base}", f"{paper}x (LLMs, 25 Gbps)",
                             _fmt_range(r), setting, spread_verdict(r, paper),
                             "a small GPT-2 on 2 CPU cores: compute and compression weigh more than on GPUs"))
        rivals = cell[cell["scheme"].isin(_sparse_rivals())]
        if not rivals.empty:  # the strongest rival of the run, whichever it is, at the paper's margin
            rival = str(rivals.loc[rivals["samples_per_s"].idxmax(), "scheme"])
            r = ratio_range(cell, "samples_per_s", "zen", rival)
            rows.append(_row(f"Fig 13/14: Zen with {squeeze} over the best other sparse scheme",
                             f"{PAPER_FIG13['omnireduce']}x (over OmniReduce, its best other)",
                             f"{_fmt_range(r)} over {rival}", setting, spread_verdict(r, PAPER_FIG13["omnireduce"]),
                             "the same compressor on every sparse scheme: the rows it leaves differ only in "
                             "how they are synchronized"))
        rows.append(_best_row(cell, f"Zen has the highest throughput with {squeeze} ({workload})", setting,
                              "the highest median samples/s among all schemes of the run, PyTorch's hooks included"))
        r = ratio_range(cell, "samples_per_s", "zen", "powersgd-4")
        rows.append(_row("Zen with DGC next to PyTorch's PowerSGD (rank 4)", "- (not in the paper)",
                         _fmt_range(r), setting, "n/a", "a comparison a user would make; see the loss rows too"))
    steps = f.get("compressed_steps")
    if steps is not None and not steps.empty:
        rows += _loss_rows(steps, int(steps["compress_warmup"].max()) if "compress_warmup" in steps else 0)
    return rows


def _sparse_rivals() -> set[str]:
    """Every registered sparse scheme but Zen's own: a baseline added in one file is a rival here too."""
    from zen.registry import make_scheme, schemes

    return {name for name in schemes() if not name.startswith("zen") and make_scheme(name).sparse_input}


def _loss_rows(steps: pd.DataFrame, after: int) -> list[Claim]:
    """Per workload at its largest world size: the largest relative gap between a compressed scheme's loss
    and dense AllReduce's at the same step, after the compressor's warm-up."""
    rows = []
    for workload, cell in steps.groupby("workload", sort=True):
        cell = cell[(cell["world_size"] == cell["world_size"].max()) & (cell["step"] >= after)]
        pivot = cell.pivot_table(index="step", columns="scheme", values="loss")
        if "allreduce" not in pivot or "zen" not in pivot:
            continue
        for scheme in [s for s in ("zen", "powersgd-4") if s in pivot]:
            gap = float(((pivot[scheme] - pivot["allreduce"]).abs() / pivot["allreduce"].abs()).max())
            rows.append(_row(f"Fig 13/14: {scheme} loss next to dense training ({workload})",
                             f"within {LOSS_TOLERANCE:.0%} (DGC: no accuracy loss)",
                             f"max gap {gap:.2%} from step {after}",
                             f"{workload}, {int(cell['world_size'].max())} ranks, same steps as AllReduce",
                             "match" if gap <= LOSS_TOLERANCE else "short",
                             "relative |loss - AllReduce's loss| at the same step"))
    return rows


def headline_claims(f: Frames) -> list[Claim]:
    t = f.get("training")
    rows = []
    if t is not None and not t.empty:
        best = None
        for (workload, n), cell in t.groupby(["workload", "world_size"], sort=True):
            r = ratio_range(cell, "comm_ms", "allreduce", "zen")
            if r is not None and r[0] != float("inf") and (best is None or r[0] > best[0][0]):
                best = (r, workload, n)
        if best:
            r, workload, n = best
            rows.append(_row("Headline: up to 5.09x communication speedup", "5.09x", _fmt_range(r),
                             f"{workload}, {n} ranks (exposed communication per step)", spread_verdict(r, 5.09), ""))
    return rows


def cluster_claims(f: Frames) -> list[Claim]:
    """Fig 15 by model at the paper's scale, and the model's error on the emulated cluster where training
    measured the same cell. Labelled "model": no run of ours had 16 x 8 GPUs."""
    c = f.get("cluster")
    if c is None or c.empty:
        return [_missing("Fig 15 (model): Zen comm-time speedup over AllReduce", "6.77x LSTM", "cluster")]
    rows = []
    big = c[~c["setting"].str.contains("emulated")]
    for workload, paper in PAPER_FIG15.items():
        z = big[(big["workload"] == workload) & (big["scheme"] == "zen")]
        if z.empty:
            continue
        r = z.iloc[0]
        rows.append(_row(f"Fig 15 (model): {PAPER_NAME[workload]} Zen comm-time speedup over AllReduce",
                         f"{paper:.2f}x", f"{r['speedup']:.2f}x",
                         f"model: {workload} 128-worker trace, {r['setting'].removeprefix('model ')} GPUs at "
                         f"{r['uplink_gbps']:g} Gbps, local work at {r['local_rate'] / 1e9:.1f}G elements/s",
                         verdict(r["speedup"], paper), "exact bytes of the trace; a model, not a measurement"))
    training = f.get("training")
    emulated = c[c["setting"].str.contains("emulated")]
    if training is not None and not emulated.empty:
        for workload, cell in emulated[emulated["scheme"] == "zen"].groupby("workload"):
            n = int(cell["world_size"].max())
            m = training[(training["workload"] == workload) & (training["world_size"] == n)
                         & (training["scheme"] == "zen")]
            if m.empty or not m["comm_ms"].iloc[0] or m["comm_ms"].iloc[0] <= 0:
                continue
            model_ms = 1e3 * float(cell[cell["world_size"] == n]["comm_s"].iloc[0])
            error = model_ms / float(m["comm_ms"].iloc[0]) - 1
            rows.append(_row(f"Cluster model against measurement: {workload} Zen at {n} ranks", "-",
                             f"model {model_ms:.0f} ms vs measured {m['comm_ms'].iloc[0]:.0f} ms ({error:+.0%})",
                             f"emulated cluster, {n} ranks at {m['bandwidth'].iloc[0] if 'bandwidth' in m else '?'}: "
                             "exposed communication per step", "match" if abs(error) <= TOLERANCE else "short",
                             "the model counts link time and local passes; measured exposed communication adds "
                             "the hook's Python work, gloo's per-message costs, and subtracts what overlaps with "
                             "backward"))
    return rows


CHECKS: list[Callable[[Frames], list[Claim]]] = [density_claims, scale_claims, cluster_claims, training_claims,
                                                 compressed_claims, kernel_claims, pull_claims, headline_claims]


def all_claims(frames: Frames) -> list[Claim]:
    return [row for check in CHECKS for row in check(frames)]


def markdown(rows: list[Claim]) -> list[str]:
    lines = ["| claim (paper) | paper | ours | our setting | verdict | why |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['setting']} | {r['verdict']} | {r['why']} |"
              for r in rows]
    return lines
