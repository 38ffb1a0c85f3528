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

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Inverse, Shape, primitive, token_dim
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn

    from ..modules.compress import MSSA


class SubspaceAttentionArgs(Args):
    """Arguments shared by every step of MSSA's form (``mssa``, ``mssa_ascent``)."""

    heads: int = Field(ge=1, description="Number of subspaces K (attention heads).")
    head_dim: int | None = Field(default=None, ge=1, description="Subspace dimension p; default d / heads.")
    output: Literal["learned", "tied"] = Field(
        default="learned",
        description="'learned': a separate output Linear(K*p, d) (003 eq. 115, what CRATE trains); "
        "'tied': project back through U itself (003 eq. 12; 63.3% vs 70.8% on ImageNet, Table 3).",
    )
    bias: bool = Field(default=True, description="Bias on the learned output (CRATE: yes; CRATE-alpha: no).")
    causal: bool = Field(default=False, description="Mask tokens after each position (book eq. 5.3.33-5.3.35).")
    step_size: float = Field(
        default=1.0,
        gt=0,
        description="Step size eta of the tied update x + eta * MSSA (ignored when output is learned).",
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
        forms={
            "listing3": Inverse("mssa_ascent", lambda args, shape: {**_ascent_args(args), "residual": "normalized"})
        },
    ),
    example=Example({"heads": 2, "head_dim": 8}, (16, 32)),
    measure=lambda: _descent_measure(),
    footprint=lambda args, shape, context: subspace_attention_footprint(args, shape, "mssa"),
)
def mssa(args: MSSAArgs, shape: Shape) -> nn.Module:
    from ..modules.compress import MSSA

    return mssa_module(MSSA, args, shape[-1], kappa=args.kappa, rate_eps=args.rate_eps)


def mssa_module(cls: type[MSSA], args: SubspaceAttentionArgs, dim: int, **extra) -> MSSA:
    """An MSSA-form module of class ``cls`` (``MSSA`` or a subclass) from spec arguments, given to it
    as plain values (checked by the footprint: ``d`` divides by ``heads`` when ``head_dim`` is not given)."""
    return cls(
        dim,
        args.heads,
        args.head_dim or dim // args.heads,
        output=args.output,
        bias=args.bias,
        causal=args.causal,
        step_size=args.step_size,
        norm=args.norm,
        eps=args.eps,
        **extra,
    )


def _descent_measure():
    from ..modules.measures import coding_rate_measure

    return coding_rate_measure("down", description="R^c(LN Z | U) against the step's own U (003 eq. 7; Fig. 3)")


def subspace_parameters(args: Args, dim: int) -> dict[str, Shape]:
    """``LN(d)`` when ``args.norm`` and the subspaces ``U = [U_1 .. U_K]: d -> K*p`` without bias:
    the parameters of every step that projects tokens onto K subspaces."""
    width = args.heads * head_dim_of(args.heads, args.head_dim, dim)
    return {**layernorm("norm", dim, present=args.norm), **linear("subspaces", dim, width, bias=False)}


def subspace_attention_footprint(args: SubspaceAttentionArgs, shape: Shape, name: str) -> Footprint:
    """A step of MSSA's form on tokens ``(n, d)``: ``LN(d)``, ``U: d -> K*p`` without bias, and the
    learned output ``K*p -> d`` (none when tied); residual, same shape out."""
    dim = token_dim(shape, name)
    parameters = subspace_parameters(args, dim)
    if args.output == "learned":
        width = parameters["subspaces.weight"][0]  # K*p
        parameters.update(linear("out", width, dim, bias=args.bias))
    return Footprint(shape, parameters, residual=True)


def _ascent_args(args: MSSAArgs) -> dict:
    """The ascent step's arguments: the same form, without eq. 10's step size (no paper inverts it)."""
    return args.model_dump(exclude={"kappa", "rate_eps"})
