"""A byte-level text corpus that needs no download: the Python standard library's own source.

Every Python installation carries its standard library as ``.py`` files, so a language model can
train on real text (code, comments, docstrings) anywhere, offline. Tokens are bytes (vocabulary
256), so no tokenizer file is needed either. The corpus is a function of the Python version only:
files are read in sorted order.

:func:`load_text` makes it the ``text`` data set of :mod:`crate_compose.data.sets`: windows of the
context's length, the held-out split the last whole files.
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ...errors import DataError
from ..record import Data
from ..set_registry import NEXT_BYTES

VOCAB = 256  # bytes
CORPUS_BYTES = 3_000_000  # read files until this many bytes
HELD_OUT = 0.1  # the last 10% of the corpus (whole files, never seen in training) is the test split


def stdlib_files() -> list[Path]:
    """The standard library's top-level ``.py`` files, sorted (tests and site-packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(path for path in root.glob("*.py") if path.is_file())


def stdlib_source(limit: int = CORPUS_BYTES) -> tuple[bytes, int]:
    """``(corpus, split)``: the concatenated source of :func:`stdlib_files` up to ``limit`` bytes,
    and the byte offset where the held-out files begin (a file boundary)."""
    parts, total = [], 0
    for path in stdlib_files():
        text = path.read_bytes()
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    boundaries = [0]
    for part in parts:
        boundaries.append(boundaries[-1] + len(part))
    target = total * (1 - HELD_OUT)
    split = min(boundaries[1:-1] or [total], key=lambda b: abs(b - target))
    return b"".join(parts), split


class Windows(Dataset):
    """Consecutive windows of a token stream: item ``i`` is ``(x, y)`` with ``x`` the ``context``
    tokens from ``i * context`` and ``y`` the same window shifted by one (the next tokens)."""

    def __init__(self, tokens: torch.Tensor, context: int) -> None:
        self.tokens, self.context = tokens, context

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.context)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.context
        window = self.tokens[start : start + self.context + 1]
        return window[:-1], window[1:]


def unigram_loss(train: torch.Tensor, test: torch.Tensor, vocab: int = VOCAB) -> float:
    """Cross-entropy (nats per token) on ``test`` of the unigram model of ``train`` (add-one counts):
    the loss of a model that ignores every earlier token."""
    counts = torch.bincount(train, minlength=vocab).double() + 1
    log_p = (counts / counts.sum()).log()
    return -log_p[test].mean().item()


def bigram_loss(train: torch.Tensor, test: torch.Tensor, vocab: int = VOCAB) -> float:
    """Cross-entropy (nats per token) on ``test[1:]``, each token given the one before it, of the bigram model
    of ``train`` with add-one counts, ``p(b | a) = (c(a, b) + 1) / (c(a) + vocab)``: the loss of a model that
    reads one token back. The counts are kept sparse (GPT-2's 50,257 ids have 2.5 billion pairs)."""
    seen, counts = torch.unique(train[:-1] * vocab + train[1:], return_counts=True)  # sorted; empty below 2 tokens
    pairs = test[:-1] * vocab + test[1:]
    pair_counts = torch.zeros(len(pairs), dtype=torch.float64)
    if len(seen):
        at = torch.searchsorted(seen, pairs).clamp(max=len(seen) - 1)
        pair_counts = torch.where(seen[at] == pairs, counts[at], 0).double()
    first_counts = torch.bincount(train[:-1], minlength=vocab).double()[test[:-1]]
    return -((pair_counts + 1) / (first_counts + vocab)).log().mean().item()


def bits(nats: float) -> float:
    return nats / math.log(2)


def load_text(*, spec: Any = None, context: int | None = None) -> Data:
    """The ``text`` data set: windows of the standard library's source as bytes (see
    :mod:`crate_compose.data.sets`); ``context`` defaults to the spec's input length."""
    if context is None:
        shape = getattr(getattr(spec, "input", None), "shape", None)
        context = shape[0] if shape and len(shape) == 1 else 128
    if context < 1:
        raise DataError(f"text: the context must be at least 1 token; got {context}")
    source, split = stdlib_source()
    if not source:
        raise DataError("text: this Python installation has no standard library source files to read")
    tokens = torch.frombuffer(bytearray(source), dtype=torch.uint8).long()
    train, test = tokens[:split], tokens[split:]
    if len(test) <= context:
        raise DataError(f"text: the held-out split ({len(test)} bytes) is shorter than the context ({context})")
    return next_token_windows("text", train, test, context)


def next_token_windows(
    name: str, train: torch.Tensor, test: torch.Tensor, context: int, vocab: int = VOCAB, tokenizer: Any = None
) -> Data:
    """A ``next-byte-text`` set of two token streams, as task ``lm`` reads them: consecutive windows of
    ``context`` ids (:class:`Windows`), ids below ``vocab``, the unigram and bigram losses of ``train`` on
    ``test``'s predicted tokens; ``tokenizer`` the one that made the ids (None: bytes)."""
    return Data(
        name=name,
        train=Windows(train, context),
        test=Windows(test, context),
        input_shape=(context,),
        classes=None,
        provides=NEXT_BYTES,
        sizes={"vocab": vocab, "context": context},
        unigram_loss=unigram_loss(train, test[1:], vocab),
        bigram_loss=bigram_loss(train, test, vocab),
        tokenizer=tokenizer,
    )
