"""Cached decoding for causal networks: each new token costs one token's work, not the context's.

A causal network's output at position t depends only on tokens up to t (book eq. 5.3.24-5.3.25),
so a decoder can push only the *new* tokens through each step, provided every step either

* acts on each token alone (``tokenwise = True``: token embedding, LayerNorm, ISTA, MLP, the
  language-model head), or
* keeps a state of what it has seen, ``decode(x_new, state) -> (y_new, state)``:

  - ``positions``: the number of tokens seen (the table is read at that offset);
  - causal MSSA: the projections ``U^T z`` of past tokens, **one** cache, since query = key = value
    (book eq. 5.3.26-5.3.31, "KV cache");
  - causal multi-head attention: its keys and values, two caches;
  - causal TSSA: running sums over positions and the position itself, a state of constant size, so
    decoding one token costs the same at any context length.

The caches and the causal attention they feed are building blocks of the steps
(:mod:`crate_compose.modules.causal`). :class:`CachedModel` walks a built model's graph step by
step with these states; :func:`generate` samples from it (or, with ``cache=False``, recomputes the
whole context at every token, the reference). Cached logits equal a full recompute (tested to 1e-5
at every step). Text goes in and out as bytes (:func:`encode_bytes`, :func:`decode_bytes`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ..modules.causal import DecodingError, kind_of, state_bytes


class CachedModel:
    """Run a built causal model on a growing sequence, keeping each step's state.

    >>> decoder = CachedModel(model)
    >>> logits = decoder(prompt_ids)       # (B, n, V): the prompt, all at once
    >>> logits = decoder(next_id[:, None]) # (B, 1, V): one more token, at the cost of one token
    """

    def __init__(self, model: fx.GraphModule) -> None:
        spec = model.meta.get("spec")
        if spec is None or spec.input.dtype != "int64":
            raise DecodingError("cached decoding needs a language model: a spec with input dtype int64")
        self.context = spec.input.shape[0]
        self.steps: list[tuple[str, nn.Module, str]] = []
        for node in model.graph.nodes:
            if node.op == "call_module":
                module = model.get_submodule(node.target)
                kind = kind_of(module)
                if kind is None or len(node.args) != 1:
                    step = node.meta.get("step", node.target)
                    raise DecodingError(
                        f"step '{step}' ({node.meta.get('primitive')}) has no incremental form: it is not causal, "
                        "or it mixes tokens without a cache; decode with cache=False"
                    )
                if kind == "state" and getattr(module, "causal", True) is False:
                    raise DecodingError(f"step '{node.meta.get('step')}' is not causal (set causal: true)")
                self.steps.append((node.target, module, kind))
            elif node.op == "call_function":
                raise DecodingError("cached decoding takes a chain of steps; this model publishes extra values")
        self.reset()

    def reset(self) -> None:
        """Forget every state: the next call starts a new sequence."""
        self.states: dict[str, Any] = {}
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by every step's state (the cache)."""
        return sum(state_bytes(state) for state in self.states.values())

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, s, V)`` for the ``s`` new token ids ``(B, s)``, given every earlier call's tokens."""
        if self.length + ids.shape[1] > self.context:
            raise DecodingError(
                f"{self.length + ids.shape[1]} tokens exceed the context of {self.context} tokens this model was "
                "built for"
            )
        x = ids
        for target, module, kind in self.steps:
            if kind == "tokenwise":
                x = module(x)
            else:
                x, self.states[target] = module.decode(x, self.states.get(target))
        self.length += ids.shape[1]
        return x


@torch.no_grad()
def generate(
    model: fx.GraphModule,
    prompt: torch.Tensor,
    tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    cache: bool = True,
) -> torch.Tensor:
    """Sample ``tokens`` new token ids after ``prompt`` ``(B, n)``; returns ``(B, n + tokens)``.

    ``temperature`` 0 takes the most likely token (greedy); ``top_k`` keeps the k most likely.
    Draws come from a generator seeded by ``seed``, so a run repeats exactly. ``cache=True`` decodes
    each new token with the steps' states (:class:`CachedModel`); ``cache=False`` recomputes the whole
    sequence for every token, the reference the cache is checked against.
    """
    if prompt.ndim == 1:
        prompt = prompt[None]
    context = model.meta["spec"].input.shape[0]
    if prompt.shape[1] < 1:
        raise DecodingError("the prompt is empty: give at least one token")
    if prompt.shape[1] + tokens > context:
        raise DecodingError(
            f"the prompt ({prompt.shape[1]} tokens) and {tokens} new tokens exceed the context of {context} tokens"
        )
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    decoder = CachedModel(model) if cache else None
    sequence = prompt
    logits = decoder(prompt)[:, -1] if decoder else model(prompt)["output"][:, -1]
    try:
        for i in range(tokens):
            token = _sample(logits.float(), temperature, top_k, generator)
            sequence = torch.cat([sequence, token], dim=1)
            if i + 1 < tokens:
                logits = decoder(token)[:, -1] if decoder else model(sequence)["output"][:, -1]
    finally:
        model.train(was_training)
    return sequence


def encode_bytes(text: str | bytes) -> torch.Tensor:
    """The bytes of ``text`` as token ids ``(1, n)`` (the byte-level vocabulary of 256).

    ``bytes`` are taken as they are; a ``str`` as UTF-8, except the characters U+DC80-U+DCFF that
    Python's ``surrogateescape`` makes of bytes that are not UTF-8 (in ``sys.argv``, file names):
    they are given back as those bytes, so a prompt typed in another encoding keeps its bytes. A
    lone surrogate that stands for no byte raises :class:`DecodingError`.
    """
    if isinstance(text, str):
        try:
            text = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as error:
            raise DecodingError(
                f"the text holds a lone surrogate {text[error.start]!r} at character {error.start}, "
                "which no UTF-8 bytes encode"
            ) from None
    return torch.tensor([list(text)], dtype=torch.long)


def ids_to_bytes(ids: torch.Tensor) -> bytes:
    """Token ids ``(n,)`` as bytes; an id beyond a byte (a vocabulary over 256) becomes 0xFF, never UTF-8."""
    return bytes(i if 0 <= i < 256 else 0xFF for i in ids.tolist())


def decode_bytes(ids: torch.Tensor) -> str:
    """Token ids back to text; ids beyond a byte and invalid UTF-8 show as U+FFFD."""
    return ids_to_bytes(ids).decode("utf-8", errors="replace")


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> torch.Tensor:
    """One token per row: the most likely at ``temperature`` 0, else a draw from ``softmax(logits / T)``
    among the ``top_k`` most likely. The division is made in float64 on logits less their maximum, so
    every scaled logit is at most 0 and the most likely token's is exactly 0: however small ``T`` is
    (``1e-300``), nothing overflows, and the draw tends to the greedy choice."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.double()
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    scaled = (logits - logits.amax(-1, keepdim=True)) / temperature
    return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)
