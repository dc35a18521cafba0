"""Native kernels (`zen build`): compiled once up front so parallel jobs never race to build them."""


rule build_kernels:
    """C++ (and, with device: cuda, CUDA) extension. A failed build is recorded, not fatal: every kernel
    has a torch-op fallback, and the report says which path ran."""
    input:
        Path("zen/native/csrc").glob("*"),
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
