"""Native kernels (`zen build`): compiled once up front so parallel jobs never race to build them."""


rule build_kernels:
    """C++ (and, with device: cuda, CUDA) extension. A failed build is recorded, not fatal: every kernel
    has a torch-op fallback, and the report says which path ran. No source inputs on purpose: torch's
    extension loader rebuilds (under a file lock) whenever a source changed, so a kernel edit reruns only
    the kernel timings (bench_kernels), not every benchmark and training run downstream of this stamp."""
    output:
        BUILD_STAMP,
    log:
        LOGS + "/build_kernels.log",
    benchmark:
        BENCHMARKS + "/build_kernels.tsv"
    params:
        cuda="yes" if config["device"] == "cuda" else "no",
    shell:
        "({ZEN} build --cuda {params.cuda} && echo 'status: built' || echo 'status: FAILED (torch-op fallback)')"
        " > {output}.tmp 2> {log} && mv {output}.tmp {output}"
