"""The masks of a text filled by a masked language model: ``crate-compose fill RUN "text with [MASK]"``.

The run's own vocabulary (``RUN/tokenizer.json``, written when it started) turns the text into ids; the
window the model reads is framed as it was trained, ``[CLS] text [SEP]``, and may be shorter than the
context (the positions table is read from its start). At every ``[MASK]`` the model's distribution over
the vocabulary gives the ``top_k`` most likely tokens with their probabilities; the text is also given back
with each mask replaced by its most likely token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..assessment.run_probes import load_weights, run_weights
from ..building.builder import compile_spec
from ..errors import WorkbenchError
from ..spec_language import loader
from ..training.identity import TOKENIZER_FILE


@dataclass(frozen=True)
class Filled:
    """One ``[MASK]``: its place among the text's tokens (``[CLS]`` is 0) and the likeliest tokens there."""

    position: int
    candidates: tuple[tuple[str, float], ...]  # (token, probability), most likely first


@dataclass(frozen=True)
class Filling:
    masks: tuple[Filled, ...]
    text: str  # the text with every mask replaced by its most likely token
    weights: Path


def read_tokenizer(run: Path):
    """The vocabulary of the run folder ``run`` (its ``tokenizer.json``)."""
    from ..data.tokens import Tokenizer

    path = Path(run) / TOKENIZER_FILE
    if not path.is_file():
        raise WorkbenchError(f"{run} has no {TOKENIZER_FILE}: it was not trained on tokenized text (fill takes a run "
                             "of task mlm, e.g. train crate-bert-mini --task mlm --data wordpiece:text)")
    return Tokenizer.from_json(path.read_text(encoding="utf-8"))


def fill(run: str | Path, text: str, *, top_k: int = 5) -> Filling:
    """The ``top_k`` completions of every ``[MASK]`` of ``text`` by the masked language model of ``run``."""
    import torch

    found = run_weights(run, "filling")
    if found.task != "mlm":
        raise WorkbenchError(f"{run} was trained for task {found.task}; fill takes a masked language model (task mlm)")
    tokenizer = read_tokenizer(Path(run))
    ids = [tokenizer.cls, *tokenizer.encode(text), tokenizer.sep]
    positions = [i for i, token in enumerate(ids) if token == tokenizer.mask]
    if not positions:
        raise WorkbenchError("the text has no [MASK]: write [MASK] where a token should be filled in")
    spec = loader.load(found.spec)
    context = spec.input.shape[0]
    if len(ids) > context:
        raise WorkbenchError(f"the text is {len(ids) - 2} tokens; the model reads at most {context - 2} (its context "
                             f"of {context} with [CLS] and [SEP])")
    model = compile_spec(spec)
    load_weights(model, found.weights)
    model.eval()
    with torch.no_grad():
        probabilities = model(torch.tensor([ids]))["output"][0].float().softmax(-1)  # (n, V)
    masks, filled = [], list(ids)
    for position in positions:
        best = probabilities[position].topk(min(top_k, probabilities.shape[-1]))
        masks.append(Filled(position, tuple((tokenizer.token(int(i)), float(p))
                                            for p, i in zip(best.values, best.indices))))
        filled[position] = int(best.indices[0])
    return Filling(tuple(masks), tokenizer.decode(filled[1:-1]), found.weights)
