"""Config validation and input helpers shared by every rule file."""

import os
import shlex
import shutil
import sys
from itertools import product

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

# Every job runs the interpreter that runs Snakemake (the venv's under `make`), so the installed
# package is importable; `script:` is not used because it only sees its own folder.
PY = shlex.quote(sys.executable)
ZEN = f"{PY} -m zen.cli"
SCRIPTS = "workflow/scripts"
RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
NETEM_TOOLS = ("ip", "tc", "nsenter", "unshare", "setpriv")

# The command that started this run, for the report (an environment variable, not a param, so a
# different command line does not make the report out of date).
os.environ.setdefault("ZEN_PIPELINE_COMMAND", shlex.join(["snakemake", *sys.argv[1:]]))
os.environ.setdefault("WANDB_MODE", config["wandb"]["mode"])


wildcard_constraints:
    pattern="random|identical|disjoint|zipf",
    world_size=r"\d+",
    density=r"[0-9.e-]+",
    backend="gloo|nccl",


def emulated_bandwidth():
    """The link rate for real-rank runs, or None for loopback: emulation needs root and iproute2 (zen/netem.py)."""
    rate = config.get("bandwidth")
    if not rate or config["backend"] != "gloo":
        return None
    if os.geteuid() != 0 or any(shutil.which(tool) is None for tool in NETEM_TOOLS):
        return None
    return rate


def bandwidth_flag():
    rate = emulated_bandwidth()
    return f"--bandwidth {rate}" if rate else ""


def wandb_flags():
    return f"--wandb-mode {config['wandb']['mode']} --wandb-project {config['wandb']['project']}"


def scheme_list():
    return ",".join(config["schemes"])


def grid(pattern_path, section, **fixed):
    """Expand `pattern_path` over the patterns x world sizes x densities of config['bench'][section]."""
    cell = config["bench"][section]
    return [
        pattern_path.format(pattern=p, world_size=n, density=d, **fixed)
        for p, n, d in product(cell["patterns"], cell["world_sizes"], cell["densities"])
    ]


def sim_bench_outputs():
    return grid(RESULTS + "/bench/sim/{pattern}/n{world_size}_d{density}.jsonl", "sim")


def real_bench_outputs():
    return grid(RESULTS + "/bench/{backend}/{pattern}/n{world_size}_d{density}.jsonl", "real",
                backend=config["backend"])
