"""Language modeling: token ids in, next-token logits out (book Sec. 5.3.3; GPT-2).

``token_embed`` looks up each token id in a learned table ``E`` of shape ``(vocab, d)``; ``lm_head``
maps each token back to logits over the vocabulary, ``logits = z W^T`` (no bias). GPT-2 and causal
CRATE tie the two, ``W = E``, written in a spec as ``tie: {weight: preprocess.embed.weight}`` on
the head (see :mod:`crate_compose.building.ties`). Positions come from the ``positions`` step, sliced to the
sequence length, so any length up to the context size is taken. Both steps act on each token alone,
so cached decoding runs them on the new tokens only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim

if TYPE_CHECKING:
    from torch import nn


class TokenEmbedArgs(Args):
    vocab: int = Field(ge=1, description="Vocabulary size V (GPT-2: 50257; bytes: 256).")
    dim: int = Field(ge=1, description="Token dimension d.")
    std: float = Field(default=0.02, gt=0, description="Standard deviation of the initial table (GPT-2: 0.02).")


@primitive(
    "token_embed",
    args=TokenEmbedArgs,
    kind="preprocess",
    objective="none (lifts token ids to vectors)",
    equation="book Sec. 5.3.3; Radford et al. 2019",
    update="E[ids]",
    description="Token embedding: look up each token id in a learned (vocab, d) table.",
    example=Example({"vocab": 50, "dim": 16}, (12,), vocab=50),
    footprint=lambda args, shape, context: _embed_footprint(args, shape),
)
def token_embed(args: TokenEmbedArgs, shape: Shape) -> nn.Module:
    from ..modules.language import TokenEmbedding

    return TokenEmbedding(args.vocab, args.dim, std=args.std)


def _embed_footprint(args: TokenEmbedArgs, shape: Shape) -> Footprint:
    """Token ids ``(n,)`` to ``(n, d)`` rows of ``E: (vocab, d)``."""
    if len(shape) != 1:
        raise ValueError(f"token_embed takes a sequence of token ids of shape (n,); got input of shape {shape}")
    return Footprint((shape[0], args.dim), {"weight": (args.vocab, args.dim)})


class LMHeadArgs(Args):
    vocab: int = Field(ge=1, description="Vocabulary size V; the same as the token embedding's when tied.")
    bias: bool = Field(default=False, description="A bias on the logits (GPT-2: none).")


@primitive(
    "lm_head",
    args=LMHeadArgs,
    kind="head",
    objective="cross-entropy of the next token (trained, not unrolled)",
    equation="book Sec. 5.3.3; Radford et al. 2019",
    update=lambda args: "Z Wᵀ + b → logits" if args.bias else "Z Wᵀ → logits",
    description="Language-model head: logits over the vocabulary at every position (tie it to the embedding "
    "with tie: {weight: preprocess.NAME.weight}).",
    example=Example({"vocab": 50}, (12, 16)),
    footprint=lambda args, shape, context: _head_footprint(args, shape),
)
def lm_head(args: LMHeadArgs, shape: Shape) -> nn.Module:
    from ..modules.language import LMHead

    return LMHead(shape[-1], args.vocab, bias=args.bias)


def _head_footprint(args: LMHeadArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(n, vocab)`` logits: ``W: (vocab, d)``, a bias ``(vocab,)`` if asked."""
    dim = token_dim(shape, "lm_head")
    parameters = {"weight": (args.vocab, dim), **({"bias": (args.vocab,)} if args.bias else {})}
    return Footprint((shape[0], args.vocab), parameters)
