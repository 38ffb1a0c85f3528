"""Standard (black-box) transformer parts, for baselines, ablations and ToST's MLP.

* ``mhsa``: ``x + W_o softmax(Q K^T / sqrt(p)) V`` with separate Q, K, V (Vaswani et al.; ViT);
  ``causal: true`` is GPT-2's attention, decoded with a cache of keys and values.
* ``mlp``: ``x + W_2 GELU(W_1 LN x)`` with hidden width ``ratio * d`` (GPT-2: ``gelu: tanh``).

Both are residual steps (:class:`~crate_compose.residual.Residual`): skip ``x``, branch the
attention or MLP output, so LayerScale (ToST, CaiT) applies to the branch. Neither is a step of a
known optimization algorithm, so neither has an inverse: a decoder cannot be derived through them.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..decoding import Growing, causal_attention
from ..registry import Args, Example, Shape, primitive, token_dim
from ..residual import Residual
from .compress import head_dim_of
from .precision import LayerNorm


class MHSA(Residual):
    """``x + MHSA(LN x)``: multi-head self-attention with separate Q/K/V projections."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = True,
        causal: bool = False,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, head_dim, causal
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=qkv_bias)
        self.out = nn.Linear(heads * head_dim, dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values ``(B, K, n, p)`` of the normalized tokens."""
        qkv = self.qkv(self.norm(x)).unflatten(-1, (3, self.heads, self.head_dim))  # (B, n, 3, K, p)
        return tuple(qkv.permute(2, 0, 3, 1, 4))  # type: ignore[return-value]

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.project(x)
        h = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # softmax(q k^T / sqrt p) v
        return x, self.out(h.transpose(1, 2).flatten(2))

    def decode(self, x: torch.Tensor, cache: tuple[Growing, Growing] | None):
        """Causal attention on new tokens given cached keys and values of earlier ones: two caches."""
        keys, values = cache or (Growing(), Growing())
        q, k, v = self.project(x)
        h = causal_attention(q, keys.extend(k), values.extend(v))
        return self.combine(x, self.out(h.transpose(1, 2).flatten(2))), (keys, values)


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
)
def mhsa(args: MHSAArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "mhsa")
    return MHSA(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        qkv_bias=args.qkv_bias,
        causal=args.causal,
        norm=args.norm,
        eps=args.eps,
    )


class MLP(Residual):
    """``x + W_2 GELU(W_1 LN x)``."""

    tokenwise = True  # each token alone (cached decoding)

    def __init__(self, dim: int, hidden: int, *, norm: bool = True, eps: float = 1e-5, gelu: str = "none") -> None:
        super().__init__()
        self.gelu = gelu
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.expand = nn.Linear(dim, hidden)
        self.contract = nn.Linear(hidden, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.contract(F.gelu(self.expand(self.norm(x)), approximate=self.gelu))  # (B, n, d)


class MLPArgs(Args):
    ratio: float = Field(default=4.0, gt=0, description="Hidden width as a multiple of d (ViT: 4).")
    norm: bool = Field(default=True, description="Apply LayerNorm before the MLP (pre-norm ViT: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (timm's ViT and ToST: 1e-6).")
    gelu: Literal["exact", "tanh"] = Field(
        default="exact", description="'exact': GELU with erf (ViT); 'tanh': its tanh approximation (GPT-2's gelu_new)."
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
)
def mlp(args: MLPArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "mlp")
    gelu = "none" if args.gelu == "exact" else "tanh"
    return MLP(dim, int(round(dim * args.ratio)), norm=args.norm, eps=args.eps, gelu=gelu)
