"""LSTM word language model: the paper's LSTM workload (Zen §6, One Billion Word, 406M parameters,
per-GPU embedding-gradient density 1.13% at batch 128).

One Billion Word is not available offline, so the text is the Penn Treebank and/or BBC News (with `corpora`,
clothing reviews too; workloads/corpora.py) with a frequency-sorted word vocabulary. The input embedding is a sparse
parameter. The output layer is a full softmax over the corpus vocabulary (dense), or, as large-vocabulary
LMs on One Billion Word are trained, a sampled softmax (`samples` > 0): each step scores the targets
against `samples` negatives drawn log-uniformly (frequent words more often; the vocabulary is sorted by
frequency), so the output embedding's gradient only has the rows of the targets and the samples and is
sparse too. Tables larger than the vocabulary (`embedding_rows`) keep rows that are never hit, as the
paper's One Billion Word vocabulary is larger than our corpus: that sets the per-GPU density.
The `scaled` preset is the paper's model scaled down to the emulated cluster with its balance kept
(communication ~80% of an AllReduce step at 4 x 1 Gbit/s; density ~1%; see docs and results/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from workloads.base import Workload, register_workload
from workloads.common import config_dict, generator, window_batches
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
    samples: int = 0  # sampled softmax with this many negatives per step; 0 = full softmax


PRESETS = {
    "tiny": LSTMPreset(corpora=("ptb",), sentence_limit=2000, embedding_rows=None, embedding_dim=16,
                       hidden=32, layers=1, proj=0, seq_len=16, batch_size=4, lr=1.0),
    "small": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=None, embedding_dim=128,
                        hidden=64, layers=1, proj=0, seq_len=35, batch_size=24, lr=1.0),
    # the paper's LSTM scaled to 4 x 1 Gbit/s: 100k-row tables in and out (~1% of the rows per step), LSTMP
    # 256 -> 128, a sampled softmax with 512 negatives; ~26M parameters, almost all in the two tables
    "scaled": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=100_000, embedding_dim=128,
                         hidden=256, layers=1, proj=128, seq_len=20, batch_size=64, lr=0.5, samples=512),
    # traces at the paper's per-GPU density (Table 1: 1.13%) at its batch (128 x 20 words): a sampled softmax of 1024
    # negatives, 120k-row tables; widths are small (a row set does not depend on them: the simulator applies the
    # paper's parameter count)
    "table1": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=120_000, embedding_dim=8,
                         hidden=16, layers=1, proj=8, seq_len=20, batch_size=128, lr=0.5, samples=1024),
    # One Billion Word sizes: 793,471-word embedding of width 512, LSTMP 2048 -> 512, 20 steps, batch 128
    "paper": LSTMPreset(corpora=("ptb", "bbc"), sentence_limit=None, embedding_rows=LM1B_VOCAB,
                        embedding_dim=512, hidden=2048, layers=1, proj=512, seq_len=20, batch_size=128,
                        lr=0.2),
}


class SampledSoftmax(nn.Module):
    """Softmax over `rows` output embeddings, estimated from the targets and `samples` shared negatives drawn
    log-uniformly over the first `vocab` ids (P(k) ~ log((k+2)/(k+1))), with the usual log-q correction and
    accidental hits removed. Output embedding and bias are tables whose gradients touch only those rows."""

    def __init__(self, rows: int, dim: int, vocab: int, samples: int):
        super().__init__()
        self.weight = nn.Embedding(rows, dim)
        self.bias = nn.Embedding(rows, 1)
        nn.init.zeros_(self.bias.weight)
        self.vocab, self.samples = vocab, samples

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        """log of the expected count of `ids` among the samples."""
        k = ids.double()
        p = torch.log((k + 2) / (k + 1)) / math.log(self.vocab + 1)
        return torch.log(-torch.expm1(self.samples * torch.log1p(-p))).float()

    def draw(self, gen: torch.Generator) -> torch.Tensor:
        """One step's negatives. They are drawn with the batch (from the rank's data stream), so the rows a
        step touches follow from its batch alone (`Workload.rows`) and every scheme sees the same ones."""
        u = torch.rand(self.samples, dtype=torch.float64, generator=gen)
        return (torch.exp(u * math.log(self.vocab + 1)).long() - 1).clamp(0, self.vocab - 1)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([targets, noise])  # one lookup per table: one (dense) table gradient, not two to add
        w, b = self.weight(ids), self.bias(ids).squeeze(-1) - self.log_q(ids)
        n = targets.numel()
        true_logit = (hidden * w[:n]).sum(-1) + b[:n]
        noise_logit = hidden @ w[n:].t() + b[n:]
        noise_logit = noise_logit.masked_fill(targets.unsqueeze(1) == noise.unsqueeze(0), float("-inf"))
        logits = torch.cat([true_logit.unsqueeze(1), noise_logit], dim=1)
        return F.cross_entropy(logits, torch.zeros_like(targets))


class LSTMLanguageModel(nn.Module):
    """Embedding -> LSTM(P) -> softmax over the corpus vocabulary (full, or sampled), untied, so the
    embedding gradient only has the rows of the batch's words. forward(inputs, targets, noise) -> the loss
    (`noise`: the sampled softmax's negatives, None with a full softmax)."""

    def __init__(self, rows: int, vocab: int, dim: int, hidden: int, layers: int, proj: int, samples: int = 0):
        super().__init__()
        self.embedding = nn.Embedding(rows, dim)
        self.lstm = nn.LSTM(dim, hidden, layers, batch_first=True, proj_size=proj)
        out = proj or hidden
        self.sampled = SampledSoftmax(rows, out, vocab, samples) if samples else None
        self.decoder = None if samples else nn.Linear(out, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor | None = None
                ) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        out = out.reshape(-1, out.shape[-1])
        if self.sampled is not None:
            assert noise is not None, "a sampled softmax takes its negatives with the batch"
            return self.sampled(out, targets.reshape(-1), noise)
        assert self.decoder is not None
        return F.cross_entropy(self.decoder(out), targets.reshape(-1))


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens = batch["tokens"]
    return model(tokens[:, :-1], tokens[:, 1:], batch.get("noise"))


@register_workload("lstm")
def build(preset: str, seed: int, corpora: tuple[str, ...] | None = None) -> Workload:
    cfg = replace(PRESETS[preset], corpora=corpora) if corpora else PRESETS[preset]
    stream, vocab = word_stream(cfg.corpora, cfg.sentence_limit)
    rows = max(cfg.embedding_rows or 0, len(vocab))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LSTMLanguageModel(rows, len(vocab), cfg.embedding_dim, cfg.hidden, cfg.layers, cfg.proj,
                                  cfg.samples)

    def batches(rank: int, world_size: int, data_seed: int) -> Iterator[dict[str, torch.Tensor]]:
        gen = generator(data_seed, rank, world_size, 0x5A3)
        for tokens in window_batches(stream, cfg.seq_len + 1, cfg.batch_size, rank, world_size, data_seed):
            yield {"tokens": tokens} | ({"noise": model.sampled.draw(gen)} if model.sampled is not None else {})

    def looked_up(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        tokens = batch["tokens"]
        out = [tokens[:, :-1].unique()]
        if model.sampled is not None:  # the output table and its bias: the targets' rows and the negatives'
            out += 2 * [torch.cat([tokens[:, 1:].reshape(-1), batch["noise"]]).unique()]
        return out

    return Workload(
        name="lstm", preset=preset, model=model, batches=batches, loss=lm_loss, rows=looked_up,
        sparse_params=["embedding.weight", *(["sampled.weight.weight", "sampled.bias.weight"] if cfg.samples else [])],
        local_batch_size=cfg.batch_size, lr=cfg.lr,
        info={"config": config_dict(cfg), "vocab_size": len(vocab), "embedding_rows": rows,
              "train_tokens": stream.numel(), "paper": {"density": 0.0113, "batch": 128, "params": 406e6}},
    )
