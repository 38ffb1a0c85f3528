"""Language modeling: token ids in, next-token logits out (book Sec. 5.3.3; GPT-2).

``token_embed`` looks up each token id in a learned table ``E`` of shape ``(vocab, d)``; ``lm_head``
maps each token back to logits over the vocabulary, ``logits = z W^T`` (no bias). GPT-2 and causal
CRATE tie the two, ``W = E``, written in a spec as ``tie: {weight: preprocess.embed.weight}`` on
the head (see :mod:`crate_compose.ties`). Positions come from the ``positions`` step, sliced to the
sequence length, so any length up to the context size is taken. Both steps act on each token alone,
so cached decoding runs them on the new tokens only.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from ..registry import Args, Example, Shape, primitive, token_dim


class TokenEmbedding(nn.Module):
    """``(B, n)`` token ids -> ``(B, n, d)`` rows of ``E`` (GPT-2: init N(0, 0.02^2))."""

    tokenwise = True  # each output token depends on its own id only (cached decoding)

    def __init__(self, vocab: int, dim: int, *, std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # E, the name GPT-2 and nn.Embedding use
        nn.init.normal_(self.weight, std=std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.is_floating_point():
            raise ValueError("token_embed takes integer token ids (set input.dtype: int64)")
        return nn.functional.embedding(ids, self.weight)


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
)
def token_embed(args: TokenEmbedArgs, shape: Shape) -> nn.Module:
    if len(shape) != 1:
        raise ValueError(f"token_embed takes a sequence of token ids of shape (n,); got input of shape {shape}")
    return TokenEmbedding(args.vocab, args.dim, std=args.std)


class LMHead(nn.Module):
    """``(B, n, d)`` -> ``(B, n, V)`` logits ``z W^T`` (+ b), one distribution per position."""

    tokenwise = True

    def __init__(self, dim: int, vocab: int, *, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # W; tied to E in GPT-2 and causal CRATE
        nn.init.normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(vocab)) if bias else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(z, self.weight, self.bias)


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
)
def lm_head(args: LMHeadArgs, shape: Shape) -> nn.Module:
    return LMHead(token_dim(shape, "lm_head"), args.vocab, bias=args.bias)
