"""GPT-2 causal-LM training on BBC News (plus clothing reviews with `corpora`), GPT-2 byte-level BPE (50,257 tokens).

Input (wte) and output (lm_head) embeddings are untied, so the wte gradient only has the rows of
the batch's tokens (Zen §2: natural sparsity of embedding gradients); lm_head is dense.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from workloads.base import Workload, register_workload
from workloads.common import config_dict, window_batches
from workloads.hf import build_untied, hf_lm_loss, transformers_offline
from workloads.text import tokenized_corpus

TOKENIZER = "gpt2"


@dataclass(frozen=True)
class GPT2Preset:
    article_limit: int | None
    n_embd: int
    n_layer: int
    n_head: int
    n_ctx: int
    batch_size: int
    lr: float
    corpora: tuple[str, ...] = ("bbc",)  # document corpora, one after the other (workloads/corpora.py)


PRESETS = {
    "tiny": GPT2Preset(article_limit=100, n_embd=32, n_layer=2, n_head=2, n_ctx=32, batch_size=4, lr=0.1),
    "small": GPT2Preset(article_limit=None, n_embd=128, n_layer=2, n_head=2, n_ctx=128, batch_size=8, lr=0.1),
    # communication-bound as the paper's LLM runs (AllReduce ~70% of a step, from their 2.0x throughput and
    # 3.44x communication speedups): width 128, 2 layers, 2 x 64 tokens per rank, so the 13.3M parameters'
    # allreduce outweighs the compute; the untied lm_head (dense, 50257 x 128) is half the bytes
    "scaled": GPT2Preset(article_limit=None, n_embd=128, n_layer=2, n_head=2, n_ctx=64, batch_size=2, lr=0.1),
    # traces at NMT's per-GPU density (Table 1: 2.47%) at its batch of 64 sentences: 64 windows of 40 tokens, narrow
    "table1": GPT2Preset(article_limit=None, n_embd=16, n_layer=1, n_head=2, n_ctx=40, batch_size=64, lr=0.1),
    # GPT-2 small (124M) plus its untied lm_head
    "paper": GPT2Preset(article_limit=None, n_embd=768, n_layer=12, n_head=12, n_ctx=1024, batch_size=8,
                        lr=0.02),
}


@register_workload("gpt2")
def build(preset: str, seed: int, corpora: tuple[str, ...] | None = None) -> Workload:
    cfg = replace(PRESETS[preset], corpora=corpora) if corpora else PRESETS[preset]
    transformers = transformers_offline()
    _, vocab, stream = tokenized_corpus(TOKENIZER, cfg.corpora, cfg.article_limit)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
        n_positions=cfg.n_ctx, tie_word_embeddings=False)
    model = build_untied(transformers.GPT2LMHeadModel, config, seed)

    def batches(rank: int, world_size: int, data_seed: int) -> Iterator[dict[str, torch.Tensor]]:
        for ids in window_batches(stream, cfg.n_ctx, cfg.batch_size, rank, world_size, data_seed):
            yield {"input_ids": ids, "labels": ids}

    return Workload(
        name="gpt2", preset=preset, model=model, batches=batches, loss=hf_lm_loss,
        # causal and shifted: a window's last token predicts nothing, so its row is touched only if it also
        # occurs earlier
        rows=lambda batch: [batch["input_ids"][:, :-1].unique()],
        sparse_params=["transformer.wte.weight"], local_batch_size=cfg.batch_size, lr=cfg.lr,
        info={"config": config_dict(cfg), "vocab_size": vocab, "tokenizer": TOKENIZER,
              "train_tokens": stream.numel()},
    )
