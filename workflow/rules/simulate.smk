"""The step simulator (simulator/, SimGrid): checked against the emulated cluster's training, then run at the
paper's scale. `make sim-fidelity` regenerates the fidelity figure alone (workflow/config/fidelity.yaml)."""

SIM = config.get("simulator", {})
FIDELITY = SIM.get("fidelity") or {}
PAPER_SIM = SIM.get("paper") or {}


def fidelity_cells():
    """(workload, world size, bandwidth) cells; none on loopback (no emulated links to compare with)."""
    if not FIDELITY or not emulated_bandwidth():
        return []
    return [(w, n, b) for w in FIDELITY["workloads"] for n in FIDELITY["world_sizes"] for b in FIDELITY["bandwidths"]]


def measured_cell(wildcards):
    """The cell's launches, `repeats` of them: the pipeline's own training cell when it ran this one (same link
    rate, every compared scheme), then launches of their own."""
    n, w, b = int(wildcards.world_size), wildcards.workload, wildcards.bandwidth
    trained = n in config["train"]["grid"].get(w, []) and b == emulated_bandwidth()
    own = [RESULTS + f"/train/{w}/n{n}.json"] if trained and set(FIDELITY["schemes"]) <= set(
        config["train"]["schemes"]) else []
    return own + [RESULTS + f"/fidelity/train/{w}/n{n}_{b}/launch{k}.json"
                  for k in range(len(own), FIDELITY.get("repeats", 1))]


rule train_fidelity:
    """A training launch only the fidelity check needs (another link rate, or a repeat): every scheme in one launch,
    timed alone."""
    input:
        BUILD_STAMP,
    output:
        RESULTS + "/fidelity/train/{workload}/n{world_size}_{bandwidth}/launch{launch}.json",
    log:
        LOGS + "/train_fidelity/{workload}/n{world_size}_{bandwidth}/launch{launch}.log",
    benchmark:
        BENCHMARKS + "/train_fidelity/{workload}/n{world_size}_{bandwidth}/launch{launch}.tsv"
    wildcard_constraints:
        launch=r"\d+",
    threads: workflow.cores  # timed: alone on the machine
    params:
        schemes=csv_list(FIDELITY.get("schemes", [])),
        preset=config["train"]["preset"],
        steps=FIDELITY.get("steps", 12),
        warmup=FIDELITY.get("warmup", 3),
        seed=config["seed"],
    shell:
        "{ZEN} train --world-size {wildcards.world_size} --bandwidth {wildcards.bandwidth} --workload {wildcards.workload}"
        " --preset {params.preset} --scheme {params.schemes} --steps {params.steps} --warmup {params.warmup}"
        " --seed {params.seed} --backend gloo --wandb-mode disabled --out {output} > {log} 2>&1"


rule measure_timeline:
    """This machine's compute timeline of a workload (one thread's CPU time, DDP's buckets)."""
    output:
        RESULTS + "/sim/timeline/{workload}.json",
    log:
        LOGS + "/measure_timeline/{workload}.log",
    benchmark:
        BENCHMARKS + "/measure_timeline/{workload}.tsv"
    params:
        preset=config["train"]["preset"],
    shell:
        "{PY} -m simulator timeline --workload {wildcards.workload} --preset {params.preset} --out {output}.tmp"
        " > {log} 2>&1 && mv {output}.tmp {output}"


rule calibrate_messages:
    """What a message costs here (latency, CPU per message and byte) on two emulated ranks."""
    output:
        RESULTS + "/sim/message_cost.json",
    log:
        LOGS + "/calibrate_messages.log",
    benchmark:
        BENCHMARKS + "/calibrate_messages.tsv"
    threads: workflow.cores  # timed
    params:
        rate=emulated_bandwidth() or "1gbit",
    shell:
        "{PY} -m simulator calibrate --bandwidth {params.rate} --out {output}.tmp > {log} 2>&1 && mv {output}.tmp {output}"


rule measure_block_cost:
    """What OmniReduce's aggregator work costs a block here (one thread; simulator/omnistream.py)."""
    output:
        RESULTS + "/sim/block_cost.json",
    log:
        LOGS + "/measure_block_cost.log",
    benchmark:
        BENCHMARKS + "/measure_block_cost.tsv"
    threads: workflow.cores  # timed
    shell:
        "{PY} -m simulator blockcost --out {output}.tmp > {log} 2>&1 && mv {output}.tmp {output}"


def block_cost_input(wildcards):
    """The measured per-block cost where the setting prices OmniReduce's streaming (`block_cost: true`)."""
    return [RESULTS + "/sim/block_cost.json"] if SIM_SETTINGS[wildcards.setting].get("block_cost") else []


rule measure_merge_cost:
    """What SparCML's merge of two streams costs here, per row and value (one thread; simulator/sparcmerge.py)."""
    output:
        RESULTS + "/sim/merge_cost.json",
    log:
        LOGS + "/measure_merge_cost.log",
    benchmark:
        BENCHMARKS + "/measure_merge_cost.tsv"
    threads: workflow.cores  # timed
    shell:
        "{PY} -m simulator mergecost --out {output}.tmp > {log} 2>&1 && mv {output}.tmp {output}"


def merge_cost_input(wildcards):
    """The measured merge cost where the setting prices SparCML's merges (`merge_cost: true`)."""
    return [RESULTS + "/sim/merge_cost.json"] if SIM_SETTINGS[wildcards.setting].get("merge_cost") else []


rule simulate_fidelity:
    """One measured cell simulated: every scheme's step on the emulated platform."""
    input:
        measured=measured_cell,
        timeline=RESULTS + "/sim/timeline/{workload}.json",
        cost=RESULTS + "/sim/message_cost.json",
    output:
        RESULTS + "/sim/fidelity/{workload}/n{world_size}_{bandwidth}.csv",
    log:
        LOGS + "/simulate_fidelity/{workload}/n{world_size}_{bandwidth}.log",
    benchmark:
        BENCHMARKS + "/simulate_fidelity/{workload}/n{world_size}_{bandwidth}.tsv"
    shell:
        "{PY} -m simulator fidelity --measured {input.measured} --timeline {input.timeline} --cost {input.cost}"
        " --csv {output} > {log} 2>&1"


rule aggregate_fidelity:
    input:
        [RESULTS + f"/sim/fidelity/{w}/n{n}_{b}.csv" for w, n, b in fidelity_cells()],
    output:
        AGG + "/sim_fidelity.csv",
    log:
        LOGS + "/aggregate_fidelity.log",
    benchmark:
        BENCHMARKS + "/aggregate_fidelity.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"


SIM_SETTINGS = {"paper": PAPER_SIM, "beyond": SIM.get("beyond") or {}}


def sim_trace_folder(wildcards):
    """The trace a setting simulates: the at-scale profile (128 workers) for the paper's, one of its own for
    `beyond` (as many workers as GPUs)."""
    if wildcards.setting == "beyond":
        return f"{RESULTS}/profile_beyond/{wildcards.workload}"
    return f"{RESULTS}/{UNION_PROFILE}/{wildcards.workload}"


rule profile_beyond:
    """The trace of `simulator.beyond`: `workers` workers from their batches' ids (13 minutes for DeepFM's
    1,024 on 2 cores), the first and last checked against a backward pass."""
    output:
        expand(RESULTS + "/profile_beyond/{{workload}}/{name}", name=PROFILE_FILES),
    log:
        LOGS + "/profile_beyond/{workload}.log",
    benchmark:
        BENCHMARKS + "/profile_beyond/{workload}.tsv"
    params:
        preset=SIM_SETTINGS["beyond"].get("preset"),
        workers=SIM_SETTINGS["beyond"].get("workers"),
        seed=config["seed"],
        out=lambda wildcards: f"{RESULTS}/profile_beyond/{wildcards.workload}",
    shell:
        "{ZEN} profile --workload {wildcards.workload} --preset {params.preset} --workers {params.workers}"
        " --steps 2 --seed {params.seed} --rows-from ids --out {params.out} > {log} 2>&1"


rule simulate_paper:
    """The paper's cluster simulated from a paper-density trace: Figs 11, 12, 15 (`paper`, the at-scale
    profile), or beyond its scale (`beyond`: more machines, faster NICs, BP and HC apart)."""
    input:
        trace=lambda wildcards: sim_trace_folder(wildcards) + "/traces.pt",
        block=block_cost_input,
        merge=merge_cost_input,
    output:
        RESULTS + "/sim/{setting}/{workload}.csv",
    log:
        LOGS + "/simulate_{setting}/{workload}.log",
    benchmark:
        BENCHMARKS + "/simulate_{setting}/{workload}.tsv"
    wildcard_constraints:
        setting="paper|beyond",
    threads: 2  # simulations at once (`--jobs`), each one core
    params:
        folder=sim_trace_folder,
        nodes=lambda wildcards: csv_list(SIM_SETTINGS[wildcards.setting].get("nodes", [16])),
        gpus=lambda wildcards: SIM_SETTINGS[wildcards.setting].get("gpus_per_node", 8),
        rates=lambda wildcards: " ".join(
            f"--bandwidth {b}" for b in SIM_SETTINGS[wildcards.setting].get("bandwidths", ["25gbit"])),
        schemes=lambda wildcards: csv_list(SIM_SETTINGS[wildcards.setting].get("schemes", [])),
        per=lambda wildcards: SIM_SETTINGS[wildcards.setting].get("per", "gpu"),
        scales=lambda wildcards: " ".join(
            f"--compute-scale {c:g}" for c in SIM_SETTINGS[wildcards.setting].get("compute_scales", [1.0])),
        block=lambda wildcards: " ".join(f"--block-cost {f}" for f in block_cost_input(wildcards)),
        merge=lambda wildcards: " ".join(f"--merge-cost {f}" for f in merge_cost_input(wildcards)),
    shell:
        "{PY} -m simulator paper --profile {params.folder} --workload {wildcards.workload} --nodes {params.nodes}"
        " --gpus-per-node {params.gpus} {params.rates} --schemes {params.schemes} --per {params.per} {params.scales}"
        " {params.block} {params.merge} --jobs {threads}"
        " --csv {output} > {log} 2>&1"


rule aggregate_paper_sim:
    input:
        lambda wildcards: expand(RESULTS + "/sim/{setting}/{workload}.csv", setting=wildcards.setting,
                                 workload=SIM_SETTINGS[wildcards.setting].get("workloads", [])),
    output:
        AGG + "/sim_{setting}.csv",
    log:
        LOGS + "/aggregate_sim_{setting}.log",
    benchmark:
        BENCHMARKS + "/aggregate_sim_{setting}.tsv"
    wildcard_constraints:
        setting="paper|beyond",
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"


FIG8_SIM = SIM.get("fig8") or {}


rule simulate_fig8:
    """Fig 8 with latency and contention: each scheme's embedding sync on a flat cluster of 2..128 GPUs, from
    the at-scale profile (paper density with the `table1` preset), beside the byte model's ratio."""
    input:
        RESULTS + f"/{UNION_PROFILE}/{{workload}}/traces.pt",
    output:
        RESULTS + "/sim/fig8/{workload}.csv",
    log:
        LOGS + "/simulate_fig8/{workload}.log",
    benchmark:
        BENCHMARKS + "/simulate_fig8/{workload}.tsv"
    params:
        folder=lambda wildcards: f"{RESULTS}/{UNION_PROFILE}/{wildcards.workload}",
        world_sizes=csv_list(FIG8_SIM.get("world_sizes", [2, 4, 8, 16, 32, 64, 128])),
        rate=FIG8_SIM.get("bandwidth", "25gbit"),
        latency=FIG8_SIM.get("latency_us", 10),
        schemes=csv_list(FIG8_SIM.get("schemes", [])),
    shell:
        "{PY} -m simulator fig8 --profile {params.folder} --workload {wildcards.workload} --world-sizes"
        " {params.world_sizes} --bandwidth {params.rate} --latency-us {params.latency} --schemes {params.schemes}"
        " --csv {output} > {log} 2>&1"


rule aggregate_fig8_sim:
    input:
        expand(RESULTS + "/sim/fig8/{workload}.csv", workload=FIG8_SIM.get("workloads", [])),
    output:
        AGG + "/sim_fig8.csv",
    log:
        LOGS + "/aggregate_sim_fig8.log",
    benchmark:
        BENCHMARKS + "/aggregate_sim_fig8.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"


LLM_SIM = SIM.get("llm") or {}


rule profile_compressed:
    """Which elements DGC chooses: `workers` data-parallel workers of the workload trained with the compressor,
    each with its own residuals (zen profile --compress; 16 GPT-2 `scaled` workers, 30 steps: minutes here)."""
    output:
        expand(RESULTS + "/profile_compressed/{{workload}}/{name}", name=PROFILE_FILES),
    log:
        LOGS + "/profile_compressed/{workload}.log",
    benchmark:
        BENCHMARKS + "/profile_compressed/{workload}.tsv"
    params:
        preset=LLM_SIM.get("preset"),
        workers=LLM_SIM.get("workers"),
        steps=LLM_SIM.get("steps"),
        flags=compress_flags(LLM_SIM) if LLM_SIM else "",
        seed=config["seed"],
        out=lambda wildcards: f"{RESULTS}/profile_compressed/{wildcards.workload}",
    shell:
        "{ZEN} profile --workload {wildcards.workload} --preset {params.preset} --workers {params.workers}"
        " --steps {params.steps} --seed {params.seed} {params.flags} --out {params.out} > {log} 2>&1"


rule simulate_llm:
    """Figs 13/14 simulated: an LLM with DGC on every bucket, tensor parallel in a machine, data parallel across
    machines, its slices patterned on the DGC trace (simulator/llm.py)."""
    input:
        RESULTS + f"/profile_compressed/{LLM_SIM.get('workload', 'gpt2')}/traces.pt",
    output:
        RESULTS + "/sim/llm/{model}.csv",
    log:
        LOGS + "/simulate_llm/{model}.log",
    benchmark:
        BENCHMARKS + "/simulate_llm/{model}.tsv"
    threads: 2  # simulations at once (`--jobs`), each one core
    params:
        folder=RESULTS + f"/profile_compressed/{LLM_SIM.get('workload', 'gpt2')}",
        nodes=csv_list(LLM_SIM.get("nodes", [16])),
        rates=" ".join(f"--bandwidth {b}" for b in LLM_SIM.get("bandwidths", ["25gbit"])),
        schemes=csv_list(LLM_SIM.get("schemes", [])),
    shell:
        "{PY} -m simulator llm --profile {params.folder} --model {wildcards.model} --nodes {params.nodes}"
        " {params.rates} --schemes {params.schemes} --jobs {threads} --csv {output} > {log} 2>&1"


rule aggregate_llm_sim:
    input:
        expand(RESULTS + "/sim/llm/{model}.csv", model=LLM_SIM.get("models", [])),
    output:
        AGG + "/sim_llm.csv",
    log:
        LOGS + "/aggregate_sim_llm.log",
    benchmark:
        BENCHMARKS + "/aggregate_sim_llm.tsv"
    shell:
        "{PY} {SCRIPTS}/aggregate.py concat --out {output} {input} > {log} 2>&1"
