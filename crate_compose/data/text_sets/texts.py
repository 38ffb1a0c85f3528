"""The text sets for masked language modelling and fine-tuning, tokenized by :mod:`.tokens`.

The data sets (:mod:`crate_compose.data.sets` dispatches to them; ``KIND`` is bytes, wordpiece, bpe or gpt2,
``-V`` the vocabulary, default 8192, bytes and gpt2 take none):

* ``KIND[-V]:text``: the standard library corpus of the ``text`` set (:func:`~.corpus.stdlib_source`, its
  train/test split), the tokenizer trained on the train split's text only; every example is
  ``[CLS] t_1 .. t_{N-2} [SEP]`` (consecutive non-overlapping chunks of the split's token stream), target
  the same tokens (the masking is the task's);
* ``KIND[-V]:folder:PATH``: the same for a folder of text files (``*.txt``, ``*.md``, ``*.py``);
* ``KIND[-V]:modules``: which of 10 standard-library modules a snippet of ``N - 2`` tokens comes from,
  tokenized by the tokenizer ``KIND[-V]:text`` trains, for fine-tuning a model pre-trained there.

``KIND[-V]:shakespeare`` (:mod:`.shakespeare`) is built the same way. Every set of token streams
(:func:`framed_data`) is also a language model's: task ``lm`` reads the same streams in next-token windows
(:func:`next_token_data`, the set's view for ``next-byte-text``, :meth:`~..record.Data.for_kinds`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ...errors import DataError
from ...files import read_input
from ..image_sets.folders import IMAGE_SUFFIXES
from ..record import Data, Tensors
from ..set_registry import LABELED_TOKENS, NEXT_BYTES, TOKENIZED_TEXT
from .corpus import (
    HELD_OUT,
    next_token_windows,
    stdlib_files,
    stdlib_source,
    unigram_loss,
)
from .tokens import DEFAULT_VOCAB, Tokenizer, check_vocab, train_tokenizer

__all__ = [
    "Framed",
    "context_of",
    "corpus_tokenizer",
    "framed_data",
    "is_text_folder",
    "labelled_snippets",
    "load_modules",
    "load_text_folder",
    "load_tokens",
    "module_files",
    "text_files",
]

TEXT_SUFFIXES = (".txt", ".md", ".py")
MAX_TEXT_BYTES = 256 << 20  # of a text folder's files together (the text set's corpus is 3 MB)
MODULES = 10  # classes of the modules set
MODULES_HELD_OUT = 0.2  # the last 20% of each module's (or play's) snippets


class Framed(Dataset):
    """BERT's windows of a token stream: item ``i`` is ``(x, x)`` with ``x`` = [CLS], the ``context - 2``
    tokens from ``i * (context - 2)``, [SEP] (consecutive, non-overlapping; the masking is the task's).
    ``tokens`` is the whole stream (int64), so a run's fingerprint covers the ids."""

    def __init__(self, tokens: torch.Tensor, context: int, cls: int, sep: int) -> None:
        self.tokens, self.context, self.cls, self.sep = tokens, context, cls, sep

    def __len__(self) -> int:
        return len(self.tokens) // (self.context - 2)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        step = self.context - 2
        x = torch.empty(self.context, dtype=torch.long)
        x[0], x[-1] = self.cls, self.sep
        x[1:-1] = self.tokens[index * step : (index + 1) * step]
        return x, x.clone()


def context_of(where: str, spec: Any, context: int | None) -> int:
    """The context as :func:`~.corpus.load_text` takes it (the spec's input length, else 128), at least 3."""
    if context is None:
        shape = getattr(getattr(spec, "input", None), "shape", None)
        context = shape[0] if shape and len(shape) == 1 else 128
    if not isinstance(context, int) or isinstance(context, bool) or context < 3:
        raise DataError(f"{where}: the context must be at least 3 tokens ([CLS], a token, [SEP]); got {context!r}")
    return context


def set_name(kind: str, vocab: int | None, source: str) -> str:
    """The canonical name of a set: ``KIND:source``, ``KIND-V:source`` when V is not the default."""
    return f"{kind}:{source}" if vocab in (None, DEFAULT_VOCAB) else f"{kind}-{vocab}:{source}"


def _text(source: bytes) -> str:
    return source.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def corpus_tokenizer(kind: str, vocab: int | None) -> Tokenizer:
    """The tokenizer ``KIND[-V]:text`` trains: on the standard-library corpus's train split only
    (:func:`~.corpus.stdlib_source`, decoded as UTF-8). ``KIND[-V]:modules`` uses the same. Cached per process."""
    source, split = stdlib_source()
    if not source:
        raise DataError("text: this Python installation has no standard library source files to read")
    return train_tokenizer(kind, vocab, [_text(source[:split])])


@functools.lru_cache(maxsize=4)
def _corpus_streams(kind: str, vocab: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    source, split = stdlib_source()
    tokenizer = corpus_tokenizer(kind, vocab)
    return tokenizer.encode_tensor(_text(source[:split])), tokenizer.encode_tensor(_text(source[split:]))


def framed_data(name: str, tokenizer: Tokenizer, train: torch.Tensor, test: torch.Tensor, context: int) -> Data:
    """A tokenized text set from its two token streams: BERT's windows (:class:`Framed`), and as a view
    (:attr:`~..record.Data.views`) the same streams in a language model's windows (:func:`next_token_data`)."""
    for split, stream in (("train", train), ("held-out", test)):
        if len(stream) < context - 2:
            raise DataError(
                f"{name}: the {split} split ({len(stream):,} tokens) is shorter than a window's "
                f"{context - 2} tokens (the context {context} less [CLS] and [SEP])"
            )
    specials = torch.tensor(sorted(tokenizer.specials))
    return Data(
        name=name,
        train=Framed(train, context, tokenizer.cls, tokenizer.sep),
        test=Framed(test, context, tokenizer.cls, tokenizer.sep),
        input_shape=(context,),
        classes=None,
        provides=TOKENIZED_TEXT,
        sizes={"vocab": tokenizer.size, "context": context, "sep": tokenizer.sep},
        unigram_loss=unigram_loss(train, test[~torch.isin(test, specials)], tokenizer.size),
        tokenizer=tokenizer,
        views={NEXT_BYTES: functools.partial(next_token_data, name, tokenizer, train, test, context)},
    )


def next_token_data(name: str, tokenizer: Tokenizer, train: torch.Tensor, test: torch.Tensor, context: int) -> Data:
    """The token streams of a tokenized text set as task ``lm`` reads them (as the ``text`` set's bytes):
    consecutive windows of ``context`` ids, the target the same window shifted by one, no [CLS] or [SEP]. The
    vocabulary is the ids text encodes to (:attr:`~.tokens.Tokenizer.text_size`: bytes 256, gpt2 GPT-2's 50,257)
    when the streams hold no special id, else the whole tokenizer's."""
    for split, stream in (("train", train), ("held-out", test)):
        if len(stream) <= context:
            raise DataError(
                f"{name}: the {split} split ({len(stream):,} tokens) is not longer than the context "
                f"({context}), so it holds no window and its next token"
            )
    specials = int(max(train.max(), test.max())) >= tokenizer.text_size
    vocab = tokenizer.size if specials else tokenizer.text_size
    return next_token_windows(name, train, test, context, vocab, tokenizer)


def load_tokens(kind: str, vocab: int | None, *, spec: Any = None, context: int | None = None) -> Data:
    """The ``KIND[-V]:text`` set: the ``text`` corpus and split, tokenized, in BERT's windows (module docstring)."""
    name = set_name(kind, vocab, "text")
    context = context_of(name, spec, context)
    check_vocab(kind, vocab)
    tokenizer = corpus_tokenizer(kind, vocab)
    train, test = _corpus_streams(kind, vocab)
    return framed_data(name, tokenizer, train, test, context)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def text_files(root: Path) -> list[Path]:
    """Every ``*.txt``, ``*.md`` and ``*.py`` file under ``root`` (any case), recursively, sorted; hidden
    files and folders (``.git``, ``.venv``) are skipped, links to folders not followed. A name of a text
    file that is not a regular file (a FIFO, a dangling link) is refused, never skipped silently."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder")
    found = []
    for top, folders, files in os.walk(root):
        folders[:] = [f for f in folders if not _hidden(f)]
        for name in files:
            path = Path(top) / name
            if _hidden(name) or path.suffix.lower() not in TEXT_SUFFIXES:
                continue
            if not path.is_file():
                raise DataError(f"{path}: not a regular file (a text file is expected here)")
            found.append(path)
    return sorted(found)


def is_text_folder(root: str | Path) -> bool:
    """Whether ``folder:PATH`` is text: a folder holding text files (:func:`text_files`) and no class
    folders of images (no image file in a folder under it, nor in one under its train/test/val)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return False

    def images_in(folder: Path) -> bool:
        try:
            return any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())
        except OSError:
            return False

    try:
        for sub in root.iterdir():
            if sub.is_dir() and not _hidden(sub.name):
                if images_in(sub):
                    return False
                if sub.name in ("train", "test", "val") and any(images_in(c) for c in sub.iterdir() if c.is_dir()):
                    return False
    except OSError:  # unreadable: the image loader names the problem
        return False
    return bool(text_files(root))


def _read_split(root: Path) -> tuple[bytes, int]:
    """The text files of ``root`` concatenated and the byte offset where the held-out files begin: the
    last whole files holding about 10% of the bytes (as :func:`~.corpus.stdlib_source` splits). Each file is
    read by :func:`crate_compose.files.read_input` (a regular file); more than :data:`MAX_TEXT_BYTES` in all
    is refused from the files' sizes, before any is read."""
    files = text_files(root)
    if not files:
        raise DataError(
            f"{root}: no text files (looked for {', '.join('*' + s for s in TEXT_SUFFIXES)} under it, recursively)"
        )
    try:
        total = sum(path.stat().st_size for path in files)
    except OSError as error:
        raise DataError(f"{error.filename}: cannot read it ({error.strerror or error})") from None
    if total > MAX_TEXT_BYTES:
        raise DataError(
            f"{root}: its text files hold {total:,} bytes, more than the {MAX_TEXT_BYTES:,} a text folder may hold"
        )
    parts, left = [], MAX_TEXT_BYTES
    for path in files:
        parts.append(read_input(path, limit=left, what="a text file"))
        left -= len(parts[-1])
    boundaries = [0]
    for part in parts:
        boundaries.append(boundaries[-1] + len(part))
    total = boundaries[-1]
    target = total * (1 - HELD_OUT)
    split = min(boundaries[1:-1] or [total], key=lambda b: abs(b - target))
    if split >= total:
        raise DataError(
            f"{root}: one text file ({files[0].name}); the last whole files are held out for "
            "testing, so a text folder needs at least two"
        )
    return b"".join(parts), split


def load_text_folder(
    path: str | Path, kind: str = "bytes", vocab: int | None = None, *, spec: Any = None, context: int | None = None
) -> Data:
    """The ``KIND[-V]:folder:PATH`` set: a folder's text files (:func:`text_files`), the last ~10% of the
    bytes (whole files) held out, the tokenizer trained on the rest; BERT's windows as ``KIND:text``."""
    root = Path(path).expanduser()
    name = set_name(kind, vocab, f"folder:{root}")
    context = context_of(name, spec, context)
    check_vocab(kind, vocab)
    source, split = _read_split(root)
    tokenizer = train_tokenizer(kind, vocab, [_text(source[:split])])
    train, test = tokenizer.encode_tensor(_text(source[:split])), tokenizer.encode_tensor(_text(source[split:]))
    return framed_data(name, tokenizer, train, test, context)


def module_files() -> list[Path]:
    """The classes of ``KIND:modules``: the :data:`MODULES` largest top-level standard-library files whose
    names do not start with "_" (ties by name), sorted by name."""
    candidates = [p for p in stdlib_files() if not p.name.startswith("_")]
    largest = sorted(candidates, key=lambda p: (-p.stat().st_size, p.name))[:MODULES]
    return sorted(largest, key=lambda p: p.stem)


@functools.lru_cache(maxsize=4)
def _module_streams(kind: str, vocab: int | None) -> tuple[tuple[str, torch.Tensor], ...]:
    tokenizer = corpus_tokenizer(kind, vocab)
    return tuple((path.stem, tokenizer.encode_tensor(_text(path.read_bytes()))) for path in module_files())


def load_modules(kind: str, vocab: int | None, *, spec: Any = None, context: int | None = None) -> Data:
    """The ``KIND[-V]:modules`` set: which standard-library module a snippet of ``N - 2`` tokens comes from
    (:func:`labelled_snippets`), in the vocabulary ``KIND[-V]:text`` learns; classes sorted by name."""
    name = set_name(kind, vocab, "modules")
    context = context_of(name, spec, context)
    check_vocab(kind, vocab)
    if len(module_files()) < MODULES:
        raise DataError(f"{name}: this Python installation has fewer than {MODULES} standard-library modules")
    return labelled_snippets(name, corpus_tokenizer(kind, vocab), _module_streams(kind, vocab), context, "module")


def labelled_snippets(
    name: str, tokenizer: Tokenizer, streams: tuple[tuple[str, torch.Tensor], ...], context: int, unit: str
) -> Data:
    """Which of ``streams`` (``(class name, token stream)``, a ``unit`` each: a module, a play) a snippet of
    ``N - 2`` tokens comes from.

    Each stream is cut in non-overlapping snippets; its first 80% are train, the last 20% test, less the
    test snippets whose tokens a train snippet (of any class) also holds (code repeats: ``# ======``
    rulers; so do a play's stage directions), so no test example is seen in training; each class keeps as
    many as the smallest class has in each split (evenly spread over its own). An example is
    ``[CLS] snippet [SEP]``, its target the class's index in ``streams``."""
    step = context - 2
    snippets = []
    for _, stream in streams:
        count = len(stream) // step
        chunks = stream[: count * step].reshape(count, step)
        cut = count - round(count * MODULES_HELD_OUT)
        snippets.append((chunks[:cut], chunks[cut:]))
    seen = {row.numpy().tobytes() for train, _ in snippets for row in train}
    snippets = [(train, test[[row.numpy().tobytes() not in seen for row in test]]) for train, test in snippets]
    splits = []
    for part in (0, 1):
        keep = min(len(s[part]) for s in snippets)
        if keep == 0:
            raise DataError(
                f"{name}: the context {context} is too long: a {unit} has no "
                f"{'test' if part else 'train'} snippet of {step} tokens"
            )
        rows, labels = [], []
        for label, pair in enumerate(snippets):
            chunks = pair[part]
            rows.append(chunks[[i * len(chunks) // keep for i in range(keep)]])
            labels += [label] * keep
        body = torch.cat(rows)
        frame = torch.empty(len(body), context, dtype=torch.long)
        frame[:, 0], frame[:, -1], frame[:, 1:-1] = tokenizer.cls, tokenizer.sep, body
        splits.append(Tensors(frame, torch.tensor(labels, dtype=torch.long)))
    return Data(
        name=name,
        train=splits[0],
        test=splits[1],
        input_shape=(context,),
        classes=len(streams),
        provides=LABELED_TOKENS,
        class_names=[label for label, _ in streams],
        sizes={"vocab": tokenizer.size, "context": context, "sep": tokenizer.sep, "classes": len(streams)},
        tokenizer=tokenizer,
    )
