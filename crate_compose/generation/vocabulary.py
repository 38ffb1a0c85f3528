"""A run's vocabulary as the text commands read it: ``fill`` (:mod:`.fill`) and ``generate`` (:mod:`.text`).

A run trained on tokenized text keeps its tokenizer in ``RUN/tokenizer.json`` (written when it started), read here
by :meth:`~crate_compose.data.text_sets.tokens.Tokenizer.read` (a regular file, its size and nesting bounded; a damaged file
is a DataError naming it). A text is checked before it is encoded (:func:`check_text`), and the vocabulary against
the rows of the model's input embedding (:func:`check_vocabulary`: a ``tokenizer.json`` that is not the run's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import DataError, WorkbenchError
from ..training.run_folder.identity import TOKENIZER_FILE

__all__ = [
    "MAX_TEXT",
    "check_text",
    "check_vocabulary",
    "embedding_vocabulary",
    "input_rows",
    "read_tokenizer",
    "tokenizer_kind",
]

MAX_TEXT = 1 << 20  # characters of a text to read (a command line's argument holds at most 128 kB on Linux)
FILL_HINT = (
    "it was not trained on tokenized text (fill takes a run of task mlm, e.g. train crate-bert-mini "
    "--task mlm --data wordpiece:text)"
)


def embedding_vocabulary(spec) -> int | None:
    """The ``vocab`` of the step that takes the token ids (the network's first step), if it declares one."""
    first = next(iter(spec.stages()), None)
    vocab = first[3].args.get("vocab") if first is not None else None
    return vocab if isinstance(vocab, int) else None


def input_rows(spec: Any, model: Any) -> int | None:
    """The rows of the model's input embedding (the tokens it can read): the ``vocab`` of its first step, else
    the rows of its first ``torch.nn.Embedding``; None when it has neither."""
    import torch

    vocab = embedding_vocabulary(spec)
    if vocab is not None:
        return vocab
    return next((module.num_embeddings for module in model.modules() if isinstance(module, torch.nn.Embedding)), None)


def read_tokenizer(run: Path, missing: str = FILL_HINT):
    """The vocabulary of the run folder ``run`` (its ``tokenizer.json``, read by
    :meth:`~crate_compose.data.text_sets.tokens.Tokenizer.read`: a damaged file is a DataError naming it); ``missing`` says
    why a run without one cannot be read."""
    from ..data.text_sets.tokens import Tokenizer

    path = Path(run) / TOKENIZER_FILE
    if not os.path.lexists(path):
        raise WorkbenchError(f"{run} has no {TOKENIZER_FILE}: {missing}")
    return Tokenizer.read(path)


def tokenizer_kind(data_name: str) -> str | None:
    """The tokenizer kind a data set's name says (``wordpiece`` of ``wordpiece-300:folder:PATH``); None for a set of
    no tokenizer (``text``) or a name no set takes now."""
    from ..data.set_registry import resolve

    try:
        return dict(resolve(data_name).arguments).get("kind")
    except DataError:
        return None


def check_text(text: str, what: str = "the text", reader: str = "fill") -> None:
    """Refuse ``what`` (a text to read) that is not valid UTF-8 (naming the first bad byte, or a lone surrogate, and
    its place) or longer than :data:`MAX_TEXT` characters."""
    if len(text) > MAX_TEXT:
        raise WorkbenchError(f"{what} is {len(text):,} characters; {reader} reads at most {MAX_TEXT:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        escaped = 0xDC80 <= code <= 0xDCFF  # a byte of a command line that is not UTF-8 (surrogateescape)
        said = f"byte 0x{code - 0xDC00:02x}" if escaped else f"U+{code:04X} (a lone surrogate)"
        raise WorkbenchError(
            f"{what} is not valid UTF-8: {said} at character {error.start + 1} of {len(text)}; give {what} in UTF-8"
        ) from None


def check_vocabulary(
    tokenizer: Any, rows: int | None, run: str | Path, weights: Path, needed: int | None = None
) -> None:
    """Refuse a vocabulary whose ids (``needed`` of them, default all its ``size``) are more than the model's input
    embedding has rows (``rows``; None: unknown)."""
    needed = tokenizer.size if needed is None else needed
    if rows is not None and needed > rows:
        raise WorkbenchError(
            f"{Path(run) / TOKENIZER_FILE} holds {needed:,} tokens, more than the {rows:,} rows "
            f"of the model's input embedding ({weights}): it is not the vocabulary the run was "
            "trained with (restore the run's tokenizer.json)"
        )
