"""What the pipeline's configuration means beyond its schema: names are listed once, by the registries, so a scheme,
pull encoding or compressor added in one file joins the grid. `all` stands for every registered scheme, pull
encoding or compressor; in a training section's schemes, `registered` stands for every registered scheme a training
comparison runs (not zen's single-plan variants, `zen-*`, which `zen`'s own trial runs), less the section's
`leave_out`. Used by workflow/rules/common.smk."""

from __future__ import annotations

from typing import Any

from zen.compress import compressors
from zen.encodings import encodings
from zen.registry import schemes

REGISTERED = "registered"


def trained_schemes(leave_out: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The registered schemes a training launch compares: dense AllReduce first (the reference), the other
    schemes by name, zen last; zen's single-plan variants and `leave_out` left out."""
    names = [s for s in schemes() if not s.startswith("zen-") and s not in leave_out]
    return sorted(names, key=lambda s: (s != "allreduce", s == "zen", s))


def expand_schemes(section: dict[str, Any]) -> None:
    """`registered` in `section["schemes"]` replaced, in place, by `trained_schemes(section["leave_out"])`."""
    names = section.get("schemes")
    if isinstance(names, list) and REGISTERED in names:
        k = names.index(REGISTERED)
        section["schemes"] = names[:k] + trained_schemes(section.get("leave_out", [])) + names[k + 1:]


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with `all` and `registered` expanded to the registered names."""
    if config.get("schemes") == "all":
        config["schemes"] = schemes()
    pull = config.get("bench", {}).get("pull", {})
    if pull.get("encodings") == "all":
        pull["encodings"] = encodings()
    for section in (config.get("train"), config.get("train_compressed"), config.get("train_compressors"),
                    (config.get("simulator") or {}).get("fidelity")):
        if section:
            expand_schemes(section)
    several = config.get("train_compressors")
    if several and several.get("compressors") == "all":
        several["compressors"] = compressors()
    return config
