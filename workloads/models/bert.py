"""BERT masked-LM pre-training on BBC News (plus clothing reviews with `corpora`), 30,522-entry uncased WordPiece.

The paper reports BERT's embedding-gradient density growing from 1.06% on one GPU to 40.8% summed
over 128 GPUs (Zen §2). Input and output embeddings are untied so the word-embedding gradient is
naturally sparse; the output layer is dense. Masking follows BERT: 15% of the tokens, of which 80%
become [MASK], 10% a random token (which touches random embedding rows) and 10% stay.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from workloads.base import Workload, register_workload
from workloads.common import config_dict, generator, window_batches
from workloads.hf import build_untied, hf_lm_loss, transformers_offline
from workloads.text import tokenized_corpus

TOKENIZER = "bert-uncased"
MASK_PROB = 0.15


@dataclass(frozen=True)
class BertPreset:
    article_limit: int | None
    hidden: int
    layers: int
    heads: int
    intermediate: int
    seq_len: int
    positions: int  # max_position_embeddings (BERT-base: 512)
    batch_size: int
    lr: float
    corpora: tuple[str, ...] = ("bbc",)  # document corpora, one after the other (workloads/corpora.py)


PRESETS = {
    "tiny": BertPreset(article_limit=100, hidden=32, layers=2, heads=2, intermediate=64, seq_len=32,
                       positions=32, batch_size=4, lr=0.1),
    "small": BertPreset(article_limit=None, hidden=128, layers=2, heads=2, intermediate=512, seq_len=128,
                        positions=128, batch_size=8, lr=0.1),
    # communication-heavier: hidden 256, 2 layers, 5 x 64 tokens (~0.6% of the vocabulary per step, the paper's
    # 1.06%); the MLM decoder (dense, 30522 x 256) is half the bytes and most of the compute
    "scaled": BertPreset(article_limit=None, hidden=256, layers=2, heads=4, intermediate=512, seq_len=64,
                         positions=64, batch_size=5, lr=0.1),
    # traces at BERT's per-GPU density (Zen section 2: 1.06%): 5 sequences of 128 tokens, narrow
    "table1": BertPreset(article_limit=None, hidden=16, layers=1, heads=2, intermediate=32, seq_len=128,
                         positions=128, batch_size=5, lr=0.1),
    # BERT-base
    "paper": BertPreset(article_limit=None, hidden=768, layers=12, heads=12, intermediate=3072, seq_len=128,
                        positions=512, batch_size=8, lr=0.02),
}


def mask_tokens(ids: torch.Tensor, special: torch.Tensor, mask_id: int, vocab: int,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's 80/10/10 masking of 15% of the non-special tokens -> (input_ids, labels)."""
    u = torch.rand(ids.shape, generator=gen)
    chosen = (u < MASK_PROB) & ~torch.isin(ids, special)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = u / MASK_PROB  # uniform on [0, 1) given chosen: splits the chosen tokens 80/10/10
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(ids, mask_id), ids)
    noise = chosen & (r >= 0.8) & (r < 0.9)
    inputs = torch.where(noise, torch.randint(vocab, ids.shape, generator=gen), inputs)
    return inputs, labels


@register_workload("bert")
def build(preset: str, seed: int, corpora: tuple[str, ...] | None = None) -> Workload:
    cfg = replace(PRESETS[preset], corpora=corpora) if corpora else PRESETS[preset]
    transformers = transformers_offline()
    tok, vocab, stream = tokenized_corpus(TOKENIZER, cfg.corpora, cfg.article_limit)
    cls_id, sep_id, mask_id = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.positions,
        tie_word_embeddings=False)
    model = build_untied(transformers.BertForMaskedLM, config, seed)
    special = torch.tensor([cls_id, sep_id, tok.token_to_id("[PAD]")])

    def batches(rank: int, world_size: int, data_seed: int) -> Iterator[dict[str, torch.Tensor]]:
        gen = generator(data_seed, rank, world_size, 0xBE27)
        edges = torch.tensor([cls_id, sep_id])
        for body in window_batches(stream, cfg.seq_len - 2, cfg.batch_size, rank, world_size, data_seed):
            ids = torch.cat([edges[0].expand(len(body), 1), body, edges[1].expand(len(body), 1)], dim=1)
            input_ids, labels = mask_tokens(ids, special, mask_id, vocab, gen)
            yield {"input_ids": input_ids, "labels": labels}

    pad = model.bert.embeddings.word_embeddings.padding_idx  # a row whose gradient is always zero

    def looked_up(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # attention spreads a masked token's loss over its whole sequence, and only that far: a sequence
        # with nothing masked gets no gradient
        ids = batch["input_ids"][(batch["labels"] != -100).any(dim=1)].unique()
        return [ids[ids != pad] if pad is not None else ids]

    return Workload(
        name="bert", preset=preset, model=model, batches=batches, loss=hf_lm_loss, rows=looked_up,
        sparse_params=["bert.embeddings.word_embeddings.weight"], local_batch_size=cfg.batch_size,
        lr=cfg.lr,
        info={"config": config_dict(cfg), "vocab_size": vocab, "tokenizer": TOKENIZER,
              "train_tokens": stream.numel(), "paper": {"density": 0.0106, "density_128_gpus": 0.408}},
    )
