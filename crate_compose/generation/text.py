"""Text from a language model: ``crate-compose generate`` (see ``docs/cli.md``, generate).

:func:`generate_text` loads a spec (and trained weights), checks everything about the request
before the model runs once, and samples with cached decoding (:func:`crate_compose.generation.decoding.generate`):

* the spec is a language model: its input is token ids (``input: {shape: [N], dtype: int64}``);
* the prompt's tokens are in the ids the weights were trained on. Weights of a run trained on a tokenized text
  set (``RUN/final``, a checkpoint; the run's ``wordpiece``, ``bpe`` or ``gpt2`` vocabulary kept in
  ``RUN/tokenizer.json``, read as ``fill`` reads it: :mod:`.vocabulary`) read the prompt in that vocabulary, and
  the new ids are decoded back to text. Any other weights (a byte-level run, a build, none) read bytes: a
  ``str`` is taken as UTF-8, and characters Python decoded with ``surrogateescape`` (a command line that is not
  UTF-8) are given back as the bytes the user typed, so ``--prompt $'\\xff\\xfe'`` is the tokens 255, 254;
* a run's ``tokenizer.json`` is readable (missing or damaged: refused, naming it) and no larger than the
  model's input embedding; the prompt is valid UTF-8 and encodes to at least one token;
* every prompt token is below the vocabulary of the step that takes the ids (``vocab`` of
  ``token_embed``, which trained weights must fit), and the logits the model samples from are over
  no more tokens than that embedding takes (nor than the run's vocabulary has), so a sampled token can be fed
  back and read;
* the prompt and the new tokens fit the spec's context.

The result keeps bytes: :attr:`Generation.text` decodes prompt and continuation together, with
bytes that are not UTF-8 shown as U+FFFD. In a run's vocabulary the prompt is kept as written and the
continuation is the text the new ids add to the prompt's ids, decoded together (a WordPiece ``##`` piece joins
the prompt's last word).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from ..assessment.run_probes import load_weights, run_of
from ..building.builder import compile_spec
from ..errors import WorkbenchError
from ..spec_language import loader
from ..training.run_folder import identity as run_records
from ..training.run_folder.preflight import check_language_model  # torch-free: the CLI refuses before torch loads
from .decoding import encode_bytes, generate, ids_to_bytes
from .vocabulary import check_text, check_vocabulary, embedding_vocabulary, input_rows, read_tokenizer, tokenizer_kind


class Generation(NamedTuple):
    """A prompt and what the model wrote after it, as bytes; ``tokens`` new tokens in ``seconds``."""

    prompt: bytes
    continuation: bytes
    tokens: int
    seconds: float

    @property
    def text(self) -> str:
        """Prompt and continuation as text; bytes that are not UTF-8 show as U+FFFD."""
        return (self.prompt + self.continuation).decode("utf-8", errors="replace")


def generate_text(
    spec_ref,
    prompt: str | bytes,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    tokens: int | None = None,
    temperature: float = 0.8,
    top_k: int | None = 40,
    seed: int = 0,
    cache: bool = True,
    device: str = "cpu",
) -> Generation:
    """Continue ``prompt`` (in the ids of ``weights``: its run's vocabulary, else bytes; see the module
    docstring) with a language model. ``tokens`` defaults to the room left in the context. Without ``weights``
    the network is untrained (seeded by ``seed``). Every check of the module docstring is made before the model
    runs; a failed one raises :class:`WorkbenchError` in one line."""
    spec = loader.load(spec_ref, overrides)
    check_language_model(spec)
    run, tokenizer = run_vocabulary(weights)
    vocab = embedding_vocabulary(spec)
    if tokenizer is None:
        ids = encode_bytes(prompt)
        if ids.shape[1] == 0:
            raise WorkbenchError("the prompt is empty: give at least one byte to continue")
        _check_prompt(ids[0].tolist(), vocab, spec.name)
    else:  # its ids are checked against the embedding once the weights are known to fit the spec
        prompt = prompt.decode("utf-8", errors="surrogateescape") if isinstance(prompt, bytes) else prompt
        ids = _encoded(tokenizer, prompt, run)
    unit = "bytes" if tokenizer is None else "tokens"
    context = spec.input.shape[0]
    if tokens is None:
        tokens = context - ids.shape[1]
        if tokens < 1:
            raise WorkbenchError(f"the prompt ({ids.shape[1]} {unit}) fills the context of {context} tokens")
    model = compile_spec(spec, seed=seed, device=device)
    if weights is not None:
        load_weights(model, Path(weights))
    logits = _output_width(model)
    if vocab is not None and logits > vocab:
        raise WorkbenchError(
            f"spec '{spec.name}' samples among {logits} tokens but its embedding takes {vocab}: "
            "a sampled token could not be fed back (give the head and the embedding one vocab)"
        )
    if tokenizer is not None:
        rows = input_rows(spec, model)
        check_vocabulary(tokenizer, rows, run, Path(weights), needed=tokenizer.text_size)
        _check_prompt(ids[0].tolist(), rows, spec.name, tokenizer)
        if logits > tokenizer.size:
            raise WorkbenchError(
                f"spec '{spec.name}' samples among {logits:,} tokens but "
                f"{run / run_records.TOKENIZER_FILE} holds {tokenizer.size:,}: a sampled id past it "
                "would be no text (it is not the vocabulary these weights were trained with)"
            )
    began = time.perf_counter()
    out = generate(model, ids.to(device), tokens, temperature=temperature, top_k=top_k, seed=seed, cache=cache)
    new = out[0, ids.shape[1] :].cpu()
    seconds = time.perf_counter() - began
    if tokenizer is None:
        return Generation(ids_to_bytes(ids[0]), ids_to_bytes(new), tokens, seconds)
    return Generation(
        prompt.encode("utf-8"), _continuation(tokenizer, ids[0].tolist(), new.tolist()).encode("utf-8"), tokens, seconds
    )


def run_vocabulary(weights) -> tuple[Path | None, Any]:
    """The run whose build ``weights`` is (:func:`~crate_compose.assessment.run_probes.run_of`) and the tokenizer
    its ids are in (its ``tokenizer.json``); the tokenizer is None for byte-level ids (no run, a run on bytes, a
    ``bytes`` tokenizer). A run trained on a tokenized set without a ``tokenizer.json`` is refused, naming it;
    a damaged one is a DataError naming the file."""
    run = run_of(weights) if weights is not None else None
    if run is None:
        return None, None
    record = run_records.read(run)
    data = record.identity["data"]["name"] if record is not None else None
    if not os.path.lexists(run / run_records.TOKENIZER_FILE) and tokenizer_kind(data or "") in (None, "bytes"):
        return run, None
    tokenizer = read_tokenizer(
        run,
        f"the vocabulary of {data}, which its weights were trained on, is gone; "
        "restore it (generate reads the prompt in the run's vocabulary)",
    )
    return run, None if tokenizer.kind == "bytes" else tokenizer


def _encoded(tokenizer: Any, prompt: str, run: Path):
    """The prompt's ids in ``tokenizer``'s vocabulary, ``(1, n)``: valid UTF-8, at least one."""
    import torch

    check_text(prompt, "the prompt", "generate")
    ids = tokenizer.encode(prompt)
    if not ids:
        raise WorkbenchError(
            f"the prompt {prompt!r} encodes to no token in the vocabulary of {run} "
            f"({tokenizer.kind}): give text to continue"
        )
    return torch.tensor([ids], dtype=torch.long)


def _continuation(tokenizer: Any, prompt: list[int], new: list[int]) -> str:
    """The text the ids ``new`` add after the ids ``prompt``: the two decoded together, less the prompt's own text
    (the new ids alone when the prompt's text is not where the whole begins)."""
    whole, head = tokenizer.decode(prompt + new), tokenizer.decode(prompt)
    return whole[len(head) :] if whole.startswith(head) else tokenizer.decode(new)


def _check_prompt(ids: list[int], vocab: int | None, name: str, tokenizer: Any = None) -> None:
    """Every prompt token (a byte, or an id of ``tokenizer``) is a token the embedding has."""
    if vocab is None:
        return
    for position, id in enumerate(ids):
        if id < vocab:
            continue
        if tokenizer is None:
            raise WorkbenchError(
                f"prompt byte {position} is {id} (0x{id:02x}); spec '{name}' has a vocabulary "
                f"of {vocab} tokens (0-{vocab - 1}), too small for this byte-level text"
            )
        raise WorkbenchError(
            f"prompt token {position} is {tokenizer.token(id)!r} (id {id:,}); spec '{name}' has a "
            f"vocabulary of {vocab:,} tokens (0-{vocab - 1:,}), which its weights were trained "
            "on: leave that token out of the prompt"
        )


def _output_width(model) -> int:
    """The number of tokens the model's logits range over (the last axis of its output)."""
    output = next(node for node in model.graph.nodes if node.op == "output")
    return output.args[0]["output"].meta["shape"][-1]
