"""Text from a byte-level language model: ``crate-compose generate`` (see ``docs/cli.md``, generate).

:func:`generate_text` loads a spec (and trained weights), checks everything about the request
before the model runs once, and samples with cached decoding (:func:`crate_compose.generation.decoding.generate`):

* the spec is a language model: its input is token ids (``input: {shape: [N], dtype: int64}``);
* the prompt's bytes are its tokens. A ``str`` is taken as UTF-8, and characters Python decoded
  with ``surrogateescape`` (a command line that is not UTF-8) are given back as the bytes the user
  typed, so ``--prompt $'\\xff\\xfe'`` is the tokens 255, 254;
* every prompt byte is below the vocabulary of the step that takes the ids (``vocab`` of
  ``token_embed``, which trained weights must fit), and the logits the model samples from are over
  no more tokens than that embedding takes, so a sampled token can be fed back;
* the prompt and the new tokens fit the spec's context.

The result keeps bytes: :attr:`Generation.text` decodes prompt and continuation together, with
bytes that are not UTF-8 shown as U+FFFD.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, NamedTuple

from ..assessment.run_probes import load_weights
from ..building.builder import compile_spec
from ..errors import WorkbenchError
from ..spec_language import loader
from ..training.preflight import check_language_model  # torch-free: the CLI refuses before torch loads
from .decoding import encode_bytes, generate, ids_to_bytes


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


def embedding_vocabulary(spec) -> int | None:
    """The ``vocab`` of the step that takes the token ids (the network's first step), if it declares one."""
    first = next(iter(spec.stages()), None)
    vocab = first[3].args.get("vocab") if first is not None else None
    return vocab if isinstance(vocab, int) else None


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
    """Continue ``prompt`` (its bytes are the tokens; see the module docstring) with a byte-level
    language model. ``tokens`` defaults to the room left in the context. Without ``weights`` the
    network is untrained (seeded by ``seed``). Every check of the module docstring is made before
    the model runs; a failed one raises :class:`WorkbenchError` in one line."""
    spec = loader.load(spec_ref, overrides)
    check_language_model(spec)
    ids = encode_bytes(prompt)
    context = spec.input.shape[0]
    if ids.shape[1] == 0:
        raise WorkbenchError("the prompt is empty: give at least one byte to continue")
    vocab = embedding_vocabulary(spec)
    _check_prompt(ids[0].tolist(), vocab, spec.name)
    if tokens is None:
        tokens = context - ids.shape[1]
        if tokens < 1:
            raise WorkbenchError(f"the prompt ({ids.shape[1]} bytes) fills the context of {context} tokens")
    model = compile_spec(spec, seed=seed, device=device)
    if weights is not None:
        load_weights(model, Path(weights))
    logits = _output_width(model)
    if vocab is not None and logits > vocab:
        raise WorkbenchError(f"spec '{spec.name}' samples among {logits} tokens but its embedding takes {vocab}: "
                             "a sampled token could not be fed back (give the head and the embedding one vocab)")
    began = time.perf_counter()
    out = generate(model, ids.to(device), tokens, temperature=temperature, top_k=top_k, seed=seed, cache=cache)
    continuation = ids_to_bytes(out[0, ids.shape[1] :].cpu())
    return Generation(ids_to_bytes(ids[0]), continuation, tokens, time.perf_counter() - began)


def _check_prompt(ids: list[int], vocab: int | None, name: str) -> None:
    """Every prompt byte is a token the embedding has."""
    if vocab is None:
        return
    for position, byte in enumerate(ids):
        if byte >= vocab:
            raise WorkbenchError(f"prompt byte {position} is {byte} (0x{byte:02x}); spec '{name}' has a vocabulary "
                                 f"of {vocab} tokens (0-{vocab - 1}), too small for this byte-level text")


def _output_width(model) -> int:
    """The number of tokens the model's logits range over (the last axis of its output)."""
    output = next(node for node in model.graph.nodes if node.op == "output")
    return output.args[0]["output"].meta["shape"][-1]
