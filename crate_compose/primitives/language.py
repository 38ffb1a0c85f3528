"""Language modeling: token ids in, logits over the vocabulary out (book Sec. 5.3.3; GPT-2; BERT).

``token_embed`` looks up each token id in a learned table ``E`` of shape ``(vocab, d)``; with
``segments`` (BERT's token types) it adds a learned row ``S[s_i]`` per token, its segment ``s_i``
counted from the ``[SEP]`` tokens before it. ``lm_head`` maps each token back to logits over the
vocabulary, ``logits = z W^T`` (no bias); ``mlm_head`` is BERT's masked-LM head,
``LN(GELU(W_t z + b_t)) W^T + b``. GPT-2, causal CRATE and BERT tie ``W = E``, written in a spec as
``tie: {weight: preprocess.embed.weight}`` on the head (see :mod:`crate_compose.building.ties`).
Positions come from the ``positions`` step, sliced to the sequence length, so any length up to the
context size is taken. The heads and a token embedding without segments act on each token alone, so
cached decoding runs them on the new tokens only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn


class TokenEmbedArgs(Args):
    vocab: int = Field(ge=1, description="Vocabulary size V (GPT-2: 50257; BERT: 30522; bytes: 256).")
    dim: int = Field(ge=1, description="Token dimension d.")
    std: float = Field(default=0.02, gt=0, description="Standard deviation of the initial tables (GPT-2, BERT: 0.02).")
    segments: int = Field(
        default=0,
        ge=0,
        description="Learned segment (token type) embeddings added to each token "
        "(BERT: 2); a token's segment is the number of [SEP] tokens before it, at most segments - 1. "
        "0: none.",
    )
    sep: int | None = Field(
        default=None, ge=0, description="Id of the [SEP] token that ends a segment (BERT: 102); required with segments."
    )

    @model_validator(mode="after")
    def _sep_with_segments(self) -> "TokenEmbedArgs":
        if self.segments > 0 and self.sep is None:
            raise ValueError(
                f"segments: {self.segments} needs sep, the id of the [SEP] token that ends a segment (BERT: 102)"
            )
        return self


@primitive(
    "token_embed",
    args=TokenEmbedArgs,
    kind="preprocess",
    objective="none (lifts token ids to vectors)",
    equation="book Sec. 5.3.3; Radford et al. 2019; segments: Devlin et al. 2019 (BERT) Sec. 3",
    update=lambda args: "E[ids] + S[seg(ids)]" if args.segments else "E[ids]",
    description="Token embedding: look up each token id in a learned (vocab, d) table (with segments, plus a "
    "learned row per segment, counted from the [SEP] tokens before it, as BERT's token types).",
    example=Example({"vocab": 50, "dim": 16}, (12,), vocab=50),
    footprint=lambda args, shape, context: _embed_footprint(args, shape),
)
def token_embed(args: TokenEmbedArgs, shape: Shape) -> nn.Module:
    from ..modules.language import TokenEmbedding

    return TokenEmbedding(args.vocab, args.dim, std=args.std, segments=args.segments, sep=args.sep)


def _embed_footprint(args: TokenEmbedArgs, shape: Shape) -> Footprint:
    """Token ids ``(n,)`` to ``(n, d)`` rows of ``E: (vocab, d)``, plus ``S: (segments, d)`` with segments."""
    if len(shape) != 1:
        raise ValueError(f"token_embed takes a sequence of token ids of shape (n,); got input of shape {shape}")
    segments = {"segment.weight": (args.segments, args.dim)} if args.segments else {}
    return Footprint((shape[0], args.dim), {"weight": (args.vocab, args.dim), **segments})


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


class MLMHeadArgs(Args):
    vocab: int = Field(
        ge=1, description="Vocabulary size V; the same as the token embedding's when tied (BERT: 30522)."
    )
    eps: float = Field(default=1e-12, gt=0, description="LayerNorm epsilon (BERT: 1e-12).")


@primitive(
    "mlm_head",
    args=MLMHeadArgs,
    kind="head",
    objective="cross-entropy of the masked tokens (trained, not unrolled)",
    equation="Devlin et al. 2019 (BERT) Sec. 3.1, App. A.1",
    update="LN(GELU(W_t Z + b_t)) Wᵀ + b → logits",
    description="BERT's masked-LM head: a dense GELU layer, LayerNorm, then logits over the vocabulary at every "
    "position (tie its weight to the embedding with tie: {weight: preprocess.NAME.weight}).",
    example=Example({"vocab": 50}, (12, 16)),
    footprint=lambda args, shape, context: _mlm_footprint(args, shape),
)
def mlm_head(args: MLMHeadArgs, shape: Shape) -> nn.Module:
    from ..modules.language import MLMHead

    return MLMHead(shape[-1], args.vocab, eps=args.eps)


def _mlm_footprint(args: MLMHeadArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(n, vocab)`` logits: ``Linear(d, d)``, ``LN(d)``, ``W: (vocab, d)``, ``b: (vocab,)``."""
    dim = token_dim(shape, "mlm_head")
    parameters = {
        **linear("dense", dim, dim),
        **layernorm("norm", dim),
        "weight": (args.vocab, dim),
        "bias": (args.vocab,),
    }
    return Footprint((shape[0], args.vocab), parameters)
