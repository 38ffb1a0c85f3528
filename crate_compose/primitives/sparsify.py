"""Sparsification: a proximal step on a LASSO against a dictionary D (the MLP of CRATE).

ISTA as CRATE implements it (paper 003 eq. 17, Algorithm 3 "FeedForward"), in rows::

    u   = LN(z)
    out = ReLU(u + eta * (u D - (u D^T) D) - eta * lambda)

one non-negative ISTA step from ``u``; the layer output is ``out`` (no residual). The paper's code
uses three matrix products; ``u D - (u D^T) D = (u - u D^T) D`` needs two.
The soft-threshold variant (003 eq. 116-117) replaces ReLU(. - eta lambda) by the two-sided
S_{eta lambda}.

Two more steps on the same objective:

* ``ista_mm``: one proximal majorization-minimization step (003 eq. 92, App. A.3; ablation in
  Table 3: 68.6% vs 70.8%), ``ReLU((1 + 4/(9(1+alpha))) u D - 4 lambda/(9 alpha))``, no skip;
* ``ista_odl``: CRATE-alpha's overcomplete dictionary learning, two ISTA steps from 0 against
  ``D`` of shape ``(d, ratio*d)``, decoded by a second dictionary ``D1`` and added back (residual).
  ``synthesis: tied, residual: false`` is the crate-lm language models' step (Bai et al., "Improving
  Neuron-level Interpretability with White-box Language Models"): the code is decoded by ``D``
  itself and replaces the token, as CRATE's ISTA output does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Inverse, Shape, primitive, token_dim
from .parts import layernorm

if TYPE_CHECKING:
    from torch import nn


class ISTAArgs(Args):
    step_size: float = Field(default=0.1, gt=0, description="Step size eta of the proximal step.")
    lambd: float = Field(default=0.1, ge=0, description="Sparsity weight lambda (CRATE 0.1; CRATE-MAE encoder 0.5).")
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (CRATE: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (CRATE 1e-5; CRATE-alpha 1e-6).")


# 001 Listing 3: the sparse code is undone by a learned dictionary, LN(x) E^T.
TO_DICTIONARY = Inverse("dictionary", lambda args, shape: {"norm": args.norm})


def _ista(threshold: str):
    def factory(args: ISTAArgs, shape: Shape) -> nn.Module:
        from ..modules.sparsify import ISTA

        return ISTA(
            shape[-1], step_size=args.step_size, lambd=args.lambd, threshold=threshold, norm=args.norm, eps=args.eps
        )

    return factory


def _dictionary_footprint(args: Args, shape: Shape, name: str, atoms: int = 1) -> Footprint:
    """Tokens ``(n, d)`` in, the same out: ``LN(d)`` when normalized and a dictionary ``D`` of
    shape ``(d, atoms * d)`` (ista_odl: and its learned synthesis ``D1``, the same shape, residual)."""
    dim = token_dim(shape, name)
    parameters = {**layernorm("norm", dim, present=args.norm), "dictionary": (dim, atoms * dim)}
    if name != "ista_odl":
        return Footprint(shape, parameters)
    synthesis = {"synthesis": (dim, atoms * dim)} if args.synthesis == "learned" else {}
    return Footprint(shape, {**parameters, **synthesis}, residual=args.residual)


def _lasso_measures():
    from ..modules.measures import lasso_measure, sparsity_measures

    return (*sparsity_measures(), lasso_measure())


def _sparsity_measures():
    from ..modules.measures import sparsity_measures

    return sparsity_measures()


def _code_measures():
    """Measured on the code a2 (recomputed from the input), not on the output, which adds the residual back."""
    from ..modules.measures import lasso_measure, sparsity_measures

    def code(module, inputs, output):
        return module.code(inputs[0])

    return (*sparsity_measures(code, start=False), lasso_measure(code, start="zero"))


def _with_ln(update: str):
    return lambda args: update + (",  Z ← LN Z" if args.norm else "")


primitive(
    "ista",
    args=ISTAArgs,
    kind="sparsify",
    objective="LASSO lambda ||X||_1 + 1/2 ||Z - D X||_F^2, X >= 0 (proximal step)",
    equation="003 eq. 17; Alg. 3",
    update=_with_ln("ReLU(Z + ηDᵀ(Z − DZ) − ηλ)"),
    description="Non-negative ISTA step: sparse-codes tokens against a complete dictionary D.",
    inverse=TO_DICTIONARY,
    example=Example(args={}, shape=(8, 16)),
    measure=_lasso_measures,
    footprint=lambda args, shape, context: _dictionary_footprint(args, shape, "ista"),
)(_ista("relu"))


primitive(
    "ista_soft",
    args=ISTAArgs,
    kind="sparsify",
    objective="LASSO lambda ||X||_1 + 1/2 ||Z - D X||_F^2 (proximal step)",
    equation="003 eq. 116-117",
    update=_with_ln("S_ηλ(Z + ηDᵀ(Z − DZ))"),
    description="Two-sided soft-threshold ISTA step (ablation, 003 App. B.5: 67.6% vs 70.8%).",
    inverse=TO_DICTIONARY,
    example=Example(args={"lambd": 0.5}, shape=(8, 16)),
    measure=_lasso_measures,
    footprint=lambda args, shape, context: _dictionary_footprint(args, shape, "ista"),
)(_ista("soft"))


class ISTAMMArgs(Args):
    alpha: float | None = Field(
        default=None,
        gt=0,
        description="alpha of R(Z) = 1/2 logdet(I + alpha Z^*Z) (003 eq. 77). Default: its definition "
        "d / (N precision^2) for the d-dimensional tokens at hand (N of them); the paper treats it as a "
        "hyperparameter and reports no value.",
    )
    precision: float = Field(
        default=0.5,
        gt=0,
        description="Precision eps of the coding rate in alpha = d / (N eps^2) (used when alpha is not given).",
    )
    lambd: float = Field(default=0.1, ge=0, description="Sparsity weight lambda.")
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (as CRATE's ISTA).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon.")


@primitive(
    "ista_mm",
    args=ISTAMMArgs,
    kind="sparsify",
    objective="lambda ||Z||_1 + chi(Z >= 0) - 1/2 logdet(I + alpha Z^*Z) (proximal majorization-minimization step)",
    equation="003 eq. 77-92; App. B.4 Table 3",
    update=lambda args: (
        "ReLU((1 + 4/(9(1+α))) D*Z − 4λ/(9α))"
        + (",  Z ← LN Z" if args.norm else "")
        + ("" if args.alpha is not None else ",  α = d/(Nε²)")
    ),
    description="Majorization-minimization sparsification step: ReLU of a scaled dictionary projection, no skip "
    "(ablation, 003 Table 3: 68.6% vs 70.8%).",
    inverse=TO_DICTIONARY,
    example=Example(args={"lambd": 0.1}, shape=(8, 16)),
    measure=_sparsity_measures,
    footprint=lambda args, shape, context: _dictionary_footprint(args, shape, "ista_mm"),
)
def ista_mm(args: ISTAMMArgs, shape: Shape) -> nn.Module:
    from ..modules.sparsify import ISTAMM

    return ISTAMM(
        shape[-1],
        alpha=args.alpha,
        precision=args.precision,
        lambd=args.lambd,
        norm=args.norm,
        eps=args.eps,
    )


class ISTAODLArgs(Args):
    step_size: float = Field(default=0.1, gt=0, description="Step size eta of both ISTA steps.")
    lambd: float = Field(default=0.1, ge=0, description="Sparsity weight lambda.")
    ratio: int = Field(
        default=4, ge=1, description="Overcompleteness: the dictionaries have ratio * d atoms (CRATE-alpha: 4)."
    )
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (CRATE-alpha: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (CRATE-alpha: 1e-6).")
    synthesis: Literal["learned", "tied"] = Field(
        default="learned",
        description="Decode the code by a learned D1 (CRATE-alpha) or by D itself (tied; crate-lm).",
    )
    residual: bool = Field(
        default=True, description="Add the decoded code back to the token (CRATE-alpha) or return it alone (crate-lm)."
    )


def _odl_update(args: ISTAODLArgs) -> str:
    decoded = "D₁A₂" if args.synthesis == "learned" else "DA₂"
    return (
        ("Z + " if args.residual else "")
        + decoded
        + ",  A₂ = ReLU(A₁ − ηDᵀ(DA₁ − U) − ηλ),  A₁ = ReLU(ηDᵀU − ηλ),  "
        + ("U = LN Z" if args.norm else "U = Z")
    )


@primitive(
    "ista_odl",
    args=ISTAODLArgs,
    kind="sparsify",
    objective="LASSO lambda ||A||_1 + 1/2 ||Z - D A||_F^2, A >= 0, overcomplete D (two proximal steps from 0)",
    equation="CRATE-alpha (Yang et al. 2024) Sec. 3; 003 eq. 17",
    update=_odl_update,
    description="Overcomplete dictionary learning step of CRATE-alpha: two ISTA steps from 0, decoded by D1, residual "
    "(or by D itself, without residual: crate-lm).",
    example=Example(args={"ratio": 2}, shape=(8, 16)),
    measure=_code_measures,
    footprint=lambda args, shape, context: _dictionary_footprint(args, shape, "ista_odl", args.ratio),
)
def ista_odl(args: ISTAODLArgs, shape: Shape) -> nn.Module:
    from ..modules.sparsify import ISTAODL

    return ISTAODL(
        shape[-1],
        ratio=args.ratio,
        step_size=args.step_size,
        lambd=args.lambd,
        norm=args.norm,
        eps=args.eps,
        tied=args.synthesis == "tied",
        residual=args.residual,
    )
