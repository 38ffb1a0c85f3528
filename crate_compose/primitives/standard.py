"""Standard (black-box) transformer parts, for baselines, ablations and ToST's MLP.

* ``mhsa``: ``x + W_o softmax(Q K^T / sqrt(p)) V`` with separate Q, K, V (Vaswani et al.; ViT);
  ``causal: true`` is GPT-2's attention, decoded with a cache of keys and values.
* ``mlp``: ``x + W_2 GELU(W_1 LN x)`` with hidden width ``ratio * d`` (GPT-2: ``gelu: tanh``).

Both are residual steps (:class:`~crate_compose.modules.residual.Residual`): skip ``x``, branch the
attention or MLP output, so LayerScale (ToST, CaiT) applies to the branch. Neither is a step of a
known optimization algorithm, so neither has an inverse: a decoder cannot be derived through them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .compress import head_dim_of
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn


class MHSAArgs(Args):
    heads: int = Field(ge=1, description="Number of attention heads K.")
    head_dim: int | None = Field(default=None, ge=1, description="Head dimension p; default d / heads.")
    qkv_bias: bool = Field(default=True, description="Bias on the Q/K/V projection (ViT: yes).")
    causal: bool = Field(default=False, description="Mask tokens after each position.")
    norm: bool = Field(default=True, description="Apply LayerNorm before the attention (pre-norm ViT: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (timm's ViT and ToST: 1e-6).")


@primitive(
    "mhsa",
    args=MHSAArgs,
    kind="attention",
    objective="none (black-box baseline)",
    equation="Vaswani et al. 2017; Dosovitskiy et al. 2021",
    update=lambda args: f"Z + MHSA{'_causal' if args.causal else ''}({'LN Z' if args.norm else 'Z'} | Q, K, V, O)",
    description="Standard multi-head self-attention with separate Q/K/V/O, pre-norm and residual (ViT).",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    footprint=lambda args, shape, context: _mhsa_footprint(args, shape),
)
def mhsa(args: MHSAArgs, shape: Shape) -> nn.Module:
    from ..modules.standard import MHSA

    dim = shape[-1]
    return MHSA(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        qkv_bias=args.qkv_bias,
        causal=args.causal,
        norm=args.norm,
        eps=args.eps,
    )


class MLPArgs(Args):
    ratio: float = Field(default=4.0, gt=0, description="Hidden width as a multiple of d (ViT: 4).")
    norm: bool = Field(default=True, description="Apply LayerNorm before the MLP (pre-norm ViT: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (timm's ViT and ToST: 1e-6).")
    gelu: Literal["exact", "tanh"] = Field(
        default="exact", description="'exact': GELU with erf (ViT); 'tanh': its tanh approximation (GPT-2's gelu_new)."
    )
    biases: bool = Field(
        default=True,
        description="Biases in both layers and the LayerNorm (nanoGPT's `bias`; the "
        "ToST language models were trained without: false).",
    )


@primitive(
    "mlp",
    args=MLPArgs,
    kind="mlp",
    objective="none (black-box baseline)",
    equation="Vaswani et al. 2017",
    update=lambda args: "Z + W₂ GELU(W₁ · LN Z)" if args.norm else "Z + W₂ GELU(W₁ Z)",
    description="Standard two-layer GELU MLP with pre-norm and residual (ViT).",
    example=Example(args={"ratio": 2.0}, shape=(8, 16)),
    footprint=lambda args, shape, context: mlp_footprint(args, shape, "mlp"),
)
def mlp(args: MLPArgs, shape: Shape) -> nn.Module:
    from ..modules.standard import MLP

    dim = shape[-1]
    gelu = "none" if args.gelu == "exact" else "tanh"
    return MLP(dim, int(round(dim * args.ratio)), norm=args.norm, eps=args.eps, gelu=gelu, bias=args.biases)


def _mhsa_footprint(args: MHSAArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)``: ``LN(d)``, ``Q, K, V: d -> 3K*p`` and ``O: K*p -> d``; residual."""
    dim = token_dim(shape, "mhsa")
    width = args.heads * head_dim_of(args.heads, args.head_dim, dim)
    parameters = {
        **layernorm("norm", dim, present=args.norm),
        **linear("qkv", dim, 3 * width, bias=args.qkv_bias),
        **linear("out", width, dim),
    }
    return Footprint(shape, parameters, residual=True)


def mlp_footprint(args: Args, shape: Shape, name: str) -> Footprint:
    """Tokens ``(n, d)``: ``LN(d)``, ``d -> round(ratio d) -> d`` with biases (unless ``biases: false``); residual."""
    dim = token_dim(shape, name)
    hidden = int(round(dim * args.ratio))
    bias = getattr(args, "biases", True)
    parameters = {
        **layernorm("norm", dim, present=args.norm, bias=bias),
        **linear("expand", dim, hidden, bias=bias),
        **linear("contract", hidden, dim, bias=bias),
    }
    return Footprint(shape, parameters, residual=True)
