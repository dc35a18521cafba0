"""Hugging Face `transformers`, strictly offline: models are built from configs with random
initialization and never fetched from the hub."""

from __future__ import annotations

import os
from types import ModuleType

import torch
from torch import nn


def transformers_offline() -> ModuleType:
    """Import `transformers` with the hub switched off (set before the import reads it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def build_untied(model_cls: type, config: object, seed: int) -> nn.Module:
    """Random-init model whose input embedding is its own parameter.

    Tied input/output embeddings (the transformers default) make the embedding gradient dense;
    untied, only the rows of the batch's tokens get a gradient (environment notes, Zen §2).
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
    if model.get_input_embeddings().weight is model.get_output_embeddings().weight:
        raise RuntimeError(f"{model_cls.__name__} still ties its input and output embeddings")
    return model


def hf_lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own LM loss (labels -100 are ignored; causal models shift labels inside)."""
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
