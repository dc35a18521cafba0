"""What the pipeline's configuration means beyond its schema: `all` stands for every registered scheme or pull
encoding, so names are listed once, by the registries, and a scheme or encoding added in one file joins the
grid. Used by workflow/rules/common.smk."""

from __future__ import annotations

from typing import Any

from zen.encodings import encodings
from zen.registry import schemes


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with `schemes: all` and `bench.pull.encodings: all` expanded to the registered names."""
    if config.get("schemes") == "all":
        config["schemes"] = schemes()
    pull = config.get("bench", {}).get("pull", {})
    if pull.get("encodings") == "all":
        pull["encodings"] = encodings()
    return config
