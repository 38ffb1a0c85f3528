"""Compression: a gradient step on the coding rate R^c against K subspaces (self-attention).

MSSA as CRATE implements it (paper 003 eq. 11-12 and App. B.1 eq. 115, Algorithm 3)::

    w   = LN(x) @ U                      # one shared projection: query = key = value
    h_k = softmax(w_k w_k^T / sqrt(p)) w_k  for each head k (optionally causal, book eq. 5.3.33)
    z   = x + concat_k(h_k) @ W_o^T + b_o   # learned output (eq. 115)
or, with the output tied to U (eq. 11-12, book eq. 5.3.2),
    z   = x + eta * concat_k(h_k) @ U^T
and, with the step size kappa of eq. 10 (``kappa`` set; ``c = kappa p / (n eps^2)``),
    z   = (1 - c) x + c * MSSA(LN x)
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..decoding import DecodingError, Growing, causal_attention
from ..probes import coding_rate_measure
from ..registry import Args, Example, Inverse, Shape, primitive, token_dim
from ..residual import Residual
from .precision import LayerNorm


class MSSA(Residual):
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
        eps: float = 1e-5,
        kappa: float | None = None,
        rate_eps: float = 0.5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal, self.step_size = heads, head_dim, causal, step_size
        self.kappa, self.rate_eps = kappa, rate_eps
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]
        self.out = nn.Linear(heads * head_dim, dim, bias=bias) if output == "learned" else None

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        """``U_k^T x`` for every head: ``(B, K, n, p)``; ``x`` already normalized."""
        return self.subspaces(x).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """``concat_k SSA(x | U_k)`` of shape ``(B, n, K*p)``; ``x`` already normalized."""
        w = self.heads_of(x)  # (B, K, n, p)
        h = F.scaled_dot_product_attention(w, w, w, is_causal=self.causal)  # softmax(w w^T p^-1/2) w
        return h.transpose(1, 2).flatten(2)  # (B, n, K*p)

    def decode(self, x: torch.Tensor, cache: Growing | None) -> tuple[torch.Tensor, Growing]:
        """Causal MSSA on new tokens ``x`` given the cached ``U^T z`` of earlier ones (book eq. 5.3.26-5.3.31):
        one cache, as query = key = value."""
        if self.kappa is not None:
            raise DecodingError("mssa with kappa scales by the number of tokens N, which grows while decoding")
        cache = cache or Growing()
        w = self.heads_of(self.norm(x))  # (B, K, s, p)
        past = cache.extend(w)  # (B, K, t, p), the new tokens included
        h = causal_attention(w, past, past).transpose(1, 2).flatten(2)
        return self.combine(x, self.project(h)), cache

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Back to tokens: the learned output, or (tied) ``eta * h U^T`` in row notation."""
        if self.out is None:
            return self.step_size * (h @ self.subspaces.weight)
        return self.out(h)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        branch = self.project(self.attend(self.norm(x)))
        if self.kappa is None:
            return x, branch
        c = self.kappa * self.head_dim / (x.shape[1] * self.rate_eps**2)  # kappa p / (N eps^2), eq. 10
        return (1 - c) * x, c * branch


class SubspaceAttentionArgs(Args):
    """Arguments shared by every step of MSSA's form (``mssa``, ``mssa_ascent``)."""

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
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (CRATE-alpha: 1e-6).")


class MSSAArgs(SubspaceAttentionArgs):
    kappa: float | None = Field(
        default=None,
        gt=0,
        description="Step size kappa of 003 eq. 10: (1 - c) Z + c MSSA(Z) with c = kappa p / (N eps^2). "
        "Unset: the plain residual Z + MSSA(Z) that CRATE trains.",
    )
    rate_eps: float = Field(default=0.5, gt=0, description="Quantization eps of the coding rate, used with kappa.")


def head_dim_of(heads: int, head_dim: int | None, dim: int) -> int:
    """The head dimension p: as given, or d / heads when d divides evenly."""
    if head_dim is not None:
        return head_dim
    if dim % heads:
        raise ValueError(f"token dimension {dim} is not divisible by heads={heads}; give head_dim")
    return dim // heads


def mssa_update(args: SubspaceAttentionArgs, sign: str = "+", skip: str = "Z", subspaces: str = "U") -> str:
    """The update in the papers' notation, showing every setting that changes the math."""
    z = "LN Z" if args.norm else "Z"
    name = "MSSA_causal" if args.causal else "MSSA"
    attend = f"{name}({z} | {subspaces})"
    if args.output == "tied":
        attend = f"{'η·' if args.step_size != 1 else ''}{attend}·{subspaces}ᵀ"
    if getattr(args, "kappa", None) is not None:
        return f"(1 − c)Z {sign} c·{attend}, c = κp/(Nε²)"
    return f"{skip} {sign} {attend}"


@primitive(
    "mssa",
    args=MSSAArgs,
    kind="compress",
    objective="coding rate R^c(Z | U) (descent)",
    equation="003 eq. 10-12, 115; Alg. 3",
    update=mssa_update,
    description="Multi-head subspace self-attention: one gradient step compressing tokens against K subspaces.",
    inverse=Inverse(
        "mssa_ascent",
        lambda args, shape: _ascent_args(args),
        forms={"listing3": Inverse("mssa_ascent", lambda args, shape: {**_ascent_args(args), "residual": "normalized"})},
    ),
    example=Example({"heads": 2, "head_dim": 8}, (16, 32)),
    measure=coding_rate_measure("down", description="R^c(LN Z | U) against the step's own U (003 eq. 7; Fig. 3)"),
)
def mssa(args: MSSAArgs, shape: Shape) -> nn.Module:
    return mssa_module(MSSA, args, token_dim(shape, "mssa"), kappa=args.kappa, rate_eps=args.rate_eps)


def _ascent_args(args: MSSAArgs) -> dict:
    """The ascent step's arguments: the same form, without eq. 10's step size (no paper inverts it)."""
    return args.model_dump(exclude={"kappa", "rate_eps"})


def mssa_module(cls: type[MSSA], args: SubspaceAttentionArgs, dim: int, **extra) -> MSSA:
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
        eps=args.eps,
        **extra,
    )
