"""The masks of a text filled by a masked language model: ``crate-compose fill RUN "text with [MASK]"``.

The run's own vocabulary (``RUN/tokenizer.json``, written when it started, read by
:meth:`~crate_compose.data.text_sets.tokens.Tokenizer.read`) turns the text into ids; the window the model reads is
framed as it was trained, ``[CLS] text [SEP]``, and may be shorter than the context (the positions table is
read from its start). At every ``[MASK]`` the model's distribution over the vocabulary gives the ``top_k``
most likely tokens with their probabilities; the text is also given back as it was written, spacing and
all, with each ``[MASK]`` replaced by the text of its most likely token.

Refused before the model runs (a :class:`~crate_compose.errors.WorkbenchError`, exit status 2): a text that
is not valid UTF-8 (a command line of other bytes reaches Python as surrogate escapes) or longer than
:data:`~.vocabulary.MAX_TEXT` characters, without a ``[MASK]`` or longer than the context; a run of another task
or without a readable ``tokenizer.json`` (every refusal names the file); a vocabulary larger than the model's input
embedding (a ``tokenizer.json`` that is not the run's: its ids past the embedding's rows could not be read).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..assessment.run_probes import load_weights, run_weights
from ..building.builder import compile_spec
from ..errors import WorkbenchError
from ..spec_language import loader
from .vocabulary import check_text, check_vocabulary, embedding_vocabulary, input_rows, read_tokenizer


@dataclass(frozen=True)
class Filled:
    """One ``[MASK]``: its place in the window the model reads (``[CLS]`` is 0, so it is the ``position``-th of
    the text's tokens, counted from 1) and the likeliest tokens there."""

    position: int
    candidates: tuple[tuple[str, float], ...]  # (token, probability), most likely first


@dataclass(frozen=True)
class Filling:
    """Every ``[MASK]`` of a text, filled: ``text`` is the text as written with each ``[MASK]`` replaced by its
    most likely token's text, ``tokens`` the number of tokens the text was read as, ``weights`` the folder read."""

    masks: tuple[Filled, ...]
    text: str
    weights: Path
    tokens: int = 0
    unknown: tuple[str, ...] = ()  # the pieces of the text the run's vocabulary reads as [UNK]


def fill(run: str | Path, text: str, *, top_k: int = 5) -> Filling:
    """The ``top_k`` completions of every ``[MASK]`` of ``text`` by the masked language model of ``run`` (every
    check of the module docstring made first)."""
    import torch

    check_text(text)
    found = run_weights(run, "filling")
    if found.task_name != "mlm":
        raise WorkbenchError(
            f"{run} was trained for task {found.task_name}; fill takes a masked language model (task mlm)"
        )
    tokenizer = read_tokenizer(Path(run))
    spec = loader.load(found.spec)
    check_vocabulary(tokenizer, embedding_vocabulary(spec), run, found.weights)  # before any id is made
    ids = [tokenizer.cls, *tokenizer.encode(text), tokenizer.sep]
    positions = [i for i, token in enumerate(ids) if token == tokenizer.mask]
    if not positions:
        raise WorkbenchError("the text has no [MASK]: write [MASK] where a token should be filled in")
    context = spec.input.shape[0]
    if len(ids) > context:
        raise WorkbenchError(
            f"the text is {len(ids) - 2} tokens; the model reads at most {context - 2} (its context "
            f"of {context} with [CLS] and [SEP])"
        )
    model = compile_spec(spec)
    load_weights(model, found.weights)
    check_vocabulary(tokenizer, input_rows(spec, model), run, found.weights)
    model.eval()
    with torch.no_grad():
        probabilities = model(torch.tensor([ids]))["output"][0].float().softmax(-1)  # (n, V)
    probabilities = probabilities[:, : tokenizer.size]  # a wider head's other ids are no token of this vocabulary
    masks, filled = [], dict.fromkeys(positions, 0)
    for position in positions:
        best = probabilities[position].topk(min(top_k, probabilities.shape[-1]))
        masks.append(
            Filled(position, tuple((tokenizer.token(int(i)), float(p)) for p, i in zip(best.values, best.indices)))
        )
        filled[position] = int(best.indices[0])
    return Filling(
        tuple(masks),
        _filled_in(text, tokenizer, ids, filled),
        found.weights,
        len(ids) - 2,
        tuple(tokenizer.unknown(text)),
    )


def _filled_in(text: str, tokenizer: Any, ids: list[int], filled: dict[int, int]) -> str:
    """``text`` as written, its ``[MASK]`` strings replaced in turn by the text of ``filled``'s ids (by window
    position). Every tokenizer reads each ``[MASK]`` string of a text as the mask token; were the counts ever
    to differ, the window with the ids filled in is decoded instead."""
    parts = text.split("[MASK]")
    if len(parts) != len(filled) + 1:
        return tokenizer.decode([filled.get(i, token) for i, token in enumerate(ids)][1:-1])
    pieces = [tokenizer.text_of(id) for id in filled.values()]
    return "".join(part + piece for part, piece in zip(parts, pieces)) + parts[-1]
