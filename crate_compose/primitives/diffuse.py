"""Structured diffusion: the inverse of an encoder layer (paper 001 Sec. 2.4-2.5, Listing 3).

Decoder layer ``g^l`` undoes encoder layer ``f^{L-l}``, its operations in reverse order, each with
its own (untied) weights:

* the inverse of the ISTA step is a learned dictionary: ``y = LN_a(x) E^T``;
* the inverse of the MSSA step is a step of *ascent* on the coding rate (001 eq. 2.16),
  ``y - MSSA(LN_b y | V)`` as the authors' code computes it (the residual adds back the
  un-normalized ``y``), or ``LN_b(y) - MSSA(LN_b y | V)`` as paper 001's Listing 3 writes it
  (``residual: normalized``).

So one CRATE-MAE decoder layer is ``y = LN_a(x) E^T; out = y - MSSA(LN_b y)`` (code) or
``y = LN_b(LN_a(x) E^T); out = y - MSSA(y)`` (Listing 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Inverse, Shape, primitive, token_dim
from .compress import SubspaceAttentionArgs, mssa_module, mssa_update, subspace_attention_footprint
from .parts import layernorm

if TYPE_CHECKING:
    from torch import nn


class AscentArgs(SubspaceAttentionArgs):
    """Arguments of ``mssa_ascent``: the MSSA form with its own subspaces V and a minus sign."""

    output: Literal["learned", "tied"] = Field(
        default="learned",
        description="'learned': a separate output Linear(K*p, d) (001 Listing 3); 'tied': back through V itself.",
    )
    step_size: float = Field(
        default=1.0, gt=0, description="Step size eta of the tied ascent Z - eta * MSSA (ignored when learned)."
    )
    residual: Literal["input", "normalized"] = Field(
        default="input",
        description="'input': Z - MSSA(LN Z | V), the authors' CRATE-MAE code; 'normalized': LN Z - MSSA(LN Z | V), "
        "paper 001's Listing 3.",
    )


def _ascent_update(args: AscentArgs) -> str:
    skip = ("LN Z" if args.norm else "Z") if args.residual == "normalized" else "Z"
    return mssa_update(args, sign="−", skip=skip, subspaces="V")


@primitive(
    "mssa_ascent",
    args=AscentArgs,
    kind="diffuse",
    objective="coding rate R^c(Z | V) (ascent: expands what compression contracted)",
    equation="001 eq. 2.16; Listing 3",
    update=_ascent_update,
    description="Inverse of the MSSA step: one step of ascent on the coding rate, with its own subspaces V.",
    inverse=Inverse("mssa", lambda args, shape: args.model_dump(exclude={"residual"})),
    example=Example({"heads": 2, "head_dim": 8}, (16, 32)),
    measure=lambda: _ascent_measure(),
    footprint=lambda args, shape, context: subspace_attention_footprint(args, shape, "mssa_ascent"),
)
def mssa_ascent(args: AscentArgs, shape: Shape) -> nn.Module:
    from ..modules.diffuse import MSSAAscent

    return mssa_module(MSSAAscent, args, shape[-1], residual=args.residual)


def _ascent_measure():
    from ..modules.measures import coding_rate_measure

    return coding_rate_measure("up", description="R^c(LN Z | V) against the step's own V: ascent (001 eq. 2.16)")


class DictionaryArgs(Args):
    norm: bool = Field(default=True, description="Apply LayerNorm before the dictionary (CRATE-MAE: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon.")


@primitive(
    "dictionary",
    args=DictionaryArgs,
    kind="diffuse",
    objective="none (synthesis Z = E X: undoes the sparse coding step)",
    equation="001 eq. 2.17, 2.20; Listing 3",
    update=lambda args: "E · LN Z" if args.norm else "E · Z",
    description="Inverse of the ISTA step: a learned linear dictionary E applied to normalized codes.",
    example=Example({}, (16, 32)),
    footprint=lambda args, shape, context: _dictionary_footprint(args, shape, context),
)
def dictionary(args: DictionaryArgs, shape: Shape) -> nn.Module:
    from ..modules.diffuse import Dictionary

    return Dictionary(shape[-1], norm=args.norm, eps=args.eps)


def _dictionary_footprint(args: DictionaryArgs, shape: Shape, context) -> Footprint:
    """``LN(d)`` and ``E: (d, d)`` on tokens ``(n, d)``; same shape out."""
    dim = token_dim(shape, "dictionary")
    return Footprint(shape, {**layernorm("norm", dim, present=args.norm), "dictionary": (dim, dim)})
