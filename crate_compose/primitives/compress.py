"""Compression: a gradient step on the coding rate R^c against K subspaces (self-attention).

MSSA as CRATE implements it (paper 003 eq. 11-12 and App. B.1 eq. 115, Algorithm 3)::

    w   = LN(x) @ U                      # one shared projection: query = key = value
    h_k = softmax(w_k w_k^T / sqrt(p)) w_k  for each head k (optionally causal, book eq. 5.3.33)
    z   = x + concat_k(h_k) @ W_o^T + b_o   # learned output (eq. 115)
or, with the output tied to U (eq. 11-12, book eq. 5.3.2),
    z   = x + eta * concat_k(h_k) @ U^T
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..registry import Args, Inverse, Shape, primitive, token_dim


class MSSA(nn.Module):
    """``x + MSSA(LN x | U)``: one step of gradient descent on R^c (003 eq. 10-12, 115).

    Shapes: ``x`` is ``(B, n, d)``; ``U`` maps ``d -> K*p``; heads are ``(B, K, n, p)``.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        output: Literal["learned", "tied"] = "learned",
        bias: bool = True,
        causal: bool = False,
        step_size: float = 1.0,
        norm: bool = True,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal, self.step_size = heads, head_dim, causal, step_size
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()
        self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]
        self.out = nn.Linear(heads * head_dim, dim, bias=bias) if output == "learned" else None

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """``concat_k SSA(x | U_k)`` of shape ``(B, n, K*p)``; ``x`` already normalized."""
        w = self.subspaces(x).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (B, K, n, p)
        h = F.scaled_dot_product_attention(w, w, w, is_causal=self.causal)  # softmax(w w^T p^-1/2) w
        return h.transpose(1, 2).flatten(2)  # (B, n, K*p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attend(self.norm(x))
        if self.out is None:  # tied: back through U itself, h @ U^T in column notation
            return x + self.step_size * (h @ self.subspaces.weight)
        return x + self.out(h)


class MSSAArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K (attention heads).")
    head_dim: int | None = Field(
        default=None, ge=1, description="Subspace dimension p; default d / heads."
    )
    output: Literal["learned", "tied"] = Field(
        default="learned",
        description="'learned': a separate output Linear(K*p, d) (003 eq. 115, what CRATE trains); "
        "'tied': project back through U itself (003 eq. 12; 63.3% vs 70.8% on ImageNet, Table 3).",
    )
    bias: bool = Field(default=True, description="Bias on the learned output (CRATE: yes; CRATE-alpha: no).")
    causal: bool = Field(
        default=False, description="Mask tokens after each position (book eq. 5.3.33-5.3.35)."
    )
    step_size: float = Field(
        default=1.0, gt=0, description="Step size eta of the tied update x + eta * MSSA (ignored when output is learned)."
    )
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (CRATE: yes).")


def head_dim_of(heads: int, head_dim: int | None, dim: int) -> int:
    """The head dimension p: as given, or d / heads when d divides evenly."""
    if head_dim is not None:
        return head_dim
    if dim % heads:
        raise ValueError(f"token dimension {dim} is not divisible by heads={heads}; give head_dim")
    return dim // heads


@primitive(
    "mssa",
    args=MSSAArgs,
    kind="compress",
    objective="coding rate R^c(Z | U) (descent)",
    equation="003 eq. 10-12, 115; Alg. 3",
    update="Z + MSSA(LN Z | U)",
    description="Multi-head subspace self-attention: one gradient step compressing tokens against K subspaces.",
    inverse=Inverse("mssa_ascent", lambda args, shape: args.model_dump()),
)
def mssa(args: MSSAArgs, shape: Shape) -> nn.Module:
    return mssa_module(MSSA, args, token_dim(shape, "mssa"))


def mssa_module(cls: type[MSSA], args: MSSAArgs, dim: int) -> MSSA:
    """An MSSA-form module of class ``cls`` from spec arguments."""
    return cls(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        output=args.output,
        bias=args.bias,
        causal=args.causal,
        step_size=args.step_size,
        norm=args.norm,
    )
