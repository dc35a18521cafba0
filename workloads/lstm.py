"""LSTM word language model: the paper's LSTM workload (Zen §6, One Billion Word, 406M parameters,
per-GPU embedding-gradient density 1.13% at batch 128).

One Billion Word is not available offline, so the text is the Penn Treebank and/or BBC News
(workloads/corpora.py) with a frequency-sorted word vocabulary. The input embedding is the sparse
parameter; the softmax layer over the corpus vocabulary is dense. The paper preset keeps the size
of the One Billion Word vocabulary (793,471 rows, 406M embedding parameters): only the corpus' word
types can ever be hit, so its per-GPU density stays below the paper's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from workloads.base import Workload, register_workload
from workloads.common import config_dict, window_batches
from workloads.text import word_stream

LM1B_VOCAB = 793_471


@dataclass(frozen=True)
class LSTMPreset:
    corpora: tuple[str, ...]
    sentence_limit: int | None  # first sentences (PTB) / articles (BBC) of each corpus; None = all
    embedding_rows: int | None  # None = the corpus vocabulary; larger = extra never-hit rows
    embedding_dim: int
    hidden: int
    layers: int
    proj: int  # LSTM projection size (LSTMP, as in big One Billion Word LMs); 0 = none
    seq_len: int
    batch_size: int
    lr: float


PRESETS = {
    "tiny": LSTMPreset(corpora=("ptb",), sentence_limit=2000, embedding_rows=None, embedding_dim=16,
                       hidden=32, layers=1, proj=0, seq_len=16, batch_size=4, lr=1.0),
    "small": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=None, embedding_dim=128,
                        hidden=64, layers=1, proj=0, seq_len=35, batch_size=24, lr=1.0),
    # One Billion Word sizes: 793,471-word embedding of width 512, LSTMP 2048 -> 512, 20 steps, batch 128
    "paper": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=LM1B_VOCAB,
                        embedding_dim=512, hidden=2048, layers=1, proj=512, seq_len=20, batch_size=128,
                        lr=0.2),
}


class LSTMLanguageModel(nn.Module):
    """Embedding -> LSTM(P) -> full softmax over the corpus vocabulary (untied, so the embedding
    gradient only has the rows of the batch's words)."""

    def __init__(self, rows: int, vocab: int, dim: int, hidden: int, layers: int, proj: int):
        super().__init__()
        self.embedding = nn.Embedding(rows, dim)
        self.lstm = nn.LSTM(dim, hidden, layers, batch_first=True, proj_size=proj)
        self.decoder = nn.Linear(proj or hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.decoder(out)


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@register_workload("lstm")
def build(preset: str, seed: int) -> Workload:
    cfg = PRESETS[preset]
    stream, vocab = word_stream(cfg.corpora, cfg.sentence_limit)
    rows = max(cfg.embedding_rows or 0, len(vocab))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LSTMLanguageModel(rows, len(vocab), cfg.embedding_dim, cfg.hidden, cfg.layers, cfg.proj)

    def batches(rank: int, world_size: int, data_seed: int) -> Iterator[dict[str, torch.Tensor]]:
        for tokens in window_batches(stream, cfg.seq_len + 1, cfg.batch_size, rank, world_size, data_seed):
            yield {"tokens": tokens}

    return Workload(
        name="lstm", preset=preset, model=model, batches=batches, loss=lm_loss,
        sparse_params=["embedding.weight"], local_batch_size=cfg.batch_size, lr=cfg.lr,
        info={"config": config_dict(cfg), "vocab_size": len(vocab), "embedding_rows": rows,
              "train_tokens": stream.numel(), "paper": {"density": 0.0113, "batch": 128, "params": 406e6}},
    )
