"""The config checked against its schema, and input helpers shared by every rule file."""

import os
import shlex
import shutil
import sys
from itertools import product
from pathlib import Path

from snakemake.utils import validate as check_schema

from harness.pipeline import resolve
from zen.encodings import encodings as registered_encodings

check_schema(config, schema="../schemas/config.schema.yaml")
resolve(config)  # `all` / `registered`: the registries' names (schemes, pull encodings, compressors; listed once)

# Every job runs the interpreter that runs Snakemake (the venv's under `make`), so the installed
# package is importable; `script:` is not used because it only sees its own folder.
PY = shlex.quote(sys.executable)
ZEN = f"{PY} -m zen.cli"
SCRIPTS = "workflow/scripts"
RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
AGG = f"{RESULTS}/aggregate"
FIGURES = f"{RESULTS}/figures"
BUILD_STAMP = f"{RESULTS}/build/native.txt"
NETEM_TOOLS = ("ip", "tc", "nsenter", "unshare", "setpriv")

# Jobs die with Snakemake, whatever killed it: each runs in a shell that has the parent-death signal set
# (workflow/scripts/job-bash), and zen's CLI exits when this Snakemake process is gone (a subshell in between
# would outlive it), its ranks with it (harness.launch); the next `make` resumes cleanly.
shell.executable(str(Path(workflow.basedir) / "workflow/scripts/job-bash"))
os.environ["ZEN_PIPELINE_PID"] = str(os.getpid())

# The command that started this run, for the report (an environment variable, not a param, so another
# command line does not make the report out of date).
os.environ.setdefault("ZEN_PIPELINE_COMMAND", shlex.join(["snakemake", *sys.argv[1:]]))
os.environ.setdefault("WANDB_MODE", config["wandb"]["mode"])
os.environ.setdefault("WANDB_SILENT", "true")


wildcard_constraints:
    pattern="random|identical|disjoint|zipf",
    world_size=r"\d+",
    density=r"[0-9.e-]+",
    backend="gloo|nccl",
    encoding="|".join(registered_encodings()),
    workload=r"[A-Za-z0-9_]+",
    scheme=r"[A-Za-z0-9_-]+",
    compressor=r"[A-Za-z0-9_-]+",
    sweep="r1|k",
    plan="dp|mixed",


def emulated_bandwidth():
    """The link rate for real-rank runs, or None for loopback: emulation needs root and iproute2 (harness/netem.py)."""
    rate = config.get("bandwidth")
    if not rate or config["backend"] != "gloo" or config["launcher"] != "spawn":
        return None
    if os.geteuid() != 0 or any(shutil.which(tool) is None for tool in NETEM_TOOLS):
        return None
    return rate


def bandwidth_flag():
    rate = emulated_bandwidth()
    return f"--bandwidth {rate}" if rate else ""


def wandb_flags():
    w = config["wandb"]
    return f"--wandb-mode {w['mode']} --wandb-project {w['project']} --wandb-group {config['run_name']}"


def csv_list(names):
    return ",".join(str(n) for n in names)


def grid(path, section, **fixed):
    """Expand `path` over the patterns x world sizes x densities of config['bench'][section]."""
    cell = config["bench"][section]
    return [
        path.format(pattern=p, world_size=n, density=d, **fixed)
        for p, n, d in product(cell["patterns"], cell["world_sizes"], cell["densities"])
    ]


def sim_bench_outputs():
    return grid(RESULTS + "/bench/sim/{pattern}/n{world_size}_d{density}.jsonl", "sim")


def real_bench_outputs():
    return grid(RESULTS + "/bench/{backend}/{pattern}/n{world_size}_d{density}.jsonl", "real",
                backend=config["backend"])


def pull_bench_outputs():
    p = config["bench"]["pull"]
    return expand(RESULTS + "/bench/pull/{encoding}/{pattern}/n{world_size}_d{density}.jsonl",
                  encoding=p["encodings"], pattern=p["pattern"], world_size=p["world_size"], density=p["densities"])


# Fig 2b and Fig 8's traces come from the at-scale profile (rows from batch ids) when the config has one
AT_SCALE = config["profile"].get("at_scale")
UNION_PROFILE = "profile_at_scale" if AT_SCALE else "profile"
UNION_WORKERS = AT_SCALE["workers"] if AT_SCALE else config["profile"]["workers"]


def profile_outputs(name, folder="profile"):
    return expand(RESULTS + "/" + folder + "/{workload}/{name}", workload=config["profile"]["workloads"], name=name)


def scale_outputs():
    s = config["scale"]
    return expand(RESULTS + "/scale/{pattern}_d{density}.csv", pattern=s["patterns"], density=s["densities"]) + expand(
        RESULTS + "/scale/trace_{workload}.csv", workload=s.get("traces", []))


def kernel_outputs():
    return expand(RESULTS + "/kernels/sweep_{sweep}.json", sweep=config["kernels"]["sweeps"])


def train_outputs(section="train"):
    """One JSON per (workload, world size) cell of config[section]'s grid, holding every scheme's run."""
    return [RESULTS + f"/{section}/{w}/n{n}.json" for w, sizes in config[section]["grid"].items() for n in sizes]


def torchrec_outputs():
    """One JSON per (plan, workload, world size) of config['train_torchrec'] (none without that section)."""
    t = config.get("train_torchrec")
    if not t:
        return []
    return [RESULTS + f"/train_torchrec/{plan}/{w}/n{n}.json" for plan in t["plans"] for w, sizes in t["grid"].items()
            for n in sizes]


def torchrec_aggregate():
    """The aggregated torchrec runs for the report, if the config trains any."""
    return [AGG + "/training_torchrec.csv"] if torchrec_outputs() else []


def compress_flags(c=None):
    """zen train's (and zen profile's) compressor flags from a config section (default: train_compressed)."""
    c = config["train_compressed"] if c is None else c
    options = " ".join(f"--compress-option {k}={v}" for k, v in sorted(c.get("options", {}).items()))
    return f"--compress {c['compress']} --density {c['density']} {options}".strip()


def nodes_for(wildcards):
    """Machines of a torchrun job (SLURM `nodes` resource); 1 for locally spawned ranks."""
    if config["launcher"] != "torchrun":
        return 1
    per_node = config["train"].get("gpus_per_node", 8)
    return max(1, int(wildcards.world_size) // per_node)


def train_launch(wildcards):
    """Command prefix that starts `zen train` on world_size ranks: local spawn, or torchrun per node."""
    n = int(wildcards.world_size)
    if config["launcher"] == "spawn":
        return f"{ZEN} train --world-size {n} {bandwidth_flag()}"
    per_node = min(n, config["train"].get("gpus_per_node", 8))
    nodes = nodes_for(wildcards)
    head = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    return (f"srun --nodes={nodes} --ntasks-per-node=1 --gres=gpu:{per_node} --kill-on-bad-exit=1"
            f" {PY} -m torch.distributed.run --nnodes={nodes} --nproc-per-node={per_node}"
            f" --rdzv-backend=c10d --rdzv-endpoint={head}:29500 --rdzv-id=$SLURM_JOB_ID -m workloads.train")
