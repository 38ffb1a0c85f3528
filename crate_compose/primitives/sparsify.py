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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..probes import lasso_measure, sparsity_measures
from ..registry import Args, Example, Inverse, Shape, primitive, token_dim
from ..residual import Residual
from .precision import LayerNorm


class ISTA(nn.Module):
    """``ISTA(LN z | D)``: one proximal-gradient step on ``lambda ||x||_1 + 1/2 ||z - D x||^2`` (003 eq. 17)."""

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        step_size: float = 0.1,
        lambd: float = 0.1,
        threshold: str = "relu",
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.step_size, self.lambd, self.threshold = step_size, lambd, threshold
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, dim))  # D
        nn.init.kaiming_uniform_(self.dictionary)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u = self.norm(z)  # (B, n, d)
        grad = F.linear(u - F.linear(u, self.dictionary), self.dictionary.t())  # D^T (u - D u), columns
        step = u + self.step_size * grad
        if self.threshold == "soft":  # S_{eta lambda}, 003 eq. 116-117
            return F.softshrink(step, self.step_size * self.lambd)
        return F.relu(step - self.step_size * self.lambd)


class ISTAArgs(Args):
    step_size: float = Field(default=0.1, gt=0, description="Step size eta of the proximal step.")
    lambd: float = Field(
        default=0.1, ge=0, description="Sparsity weight lambda (CRATE 0.1; CRATE-MAE encoder 0.5)."
    )
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (CRATE: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (CRATE 1e-5; CRATE-alpha 1e-6).")


# 001 Listing 3: the sparse code is undone by a learned dictionary, LN(x) E^T.
TO_DICTIONARY = Inverse("dictionary", lambda args, shape: {"norm": args.norm})


def _ista(threshold: str):
    def factory(args: ISTAArgs, shape: Shape) -> nn.Module:
        dim = token_dim(shape, "ista")
        return ISTA(
            dim, step_size=args.step_size, lambd=args.lambd, threshold=threshold, norm=args.norm, eps=args.eps
        )

    return factory


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
    measure=(*sparsity_measures(), lasso_measure()),
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
    measure=(*sparsity_measures(), lasso_measure()),
)(_ista("soft"))


# ------------------------------------------------------------------ majorization-minimization (003 eq. 92)


class ISTAMM(nn.Module):
    """``ReLU((1 + 4/(9(1+alpha))) D^* LN(z) - 4 lambda/(9 alpha))``: one proximal MM step (003 eq. 77-92).

    The step minimizes a quadratic majorizer of ``lambda ||Z||_1 + chi_{Z >= 0} - R(Z)`` with
    ``R(Z) = 1/2 logdet(I + alpha Z^* Z)``, ``alpha = d / (N eps^2)`` (003 eq. 77), around the
    post-compression iterate rotated by an orthogonal dictionary ``D``. In rows: ``u @ D``. No skip.
    With ``alpha`` not given, it is computed from its definition for the tokens at hand
    (``d`` features, ``N`` tokens, precision ``eps`` of the coding rate); the paper leaves it a
    hyperparameter and reports no value.
    """

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        alpha: float | None = None,
        precision: float = 0.5,
        lambd: float = 0.1,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.alpha, self.precision, self.lambd = alpha, precision, lambd
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, dim))  # D (orthogonal in the derivation; learned here)
        nn.init.kaiming_uniform_(self.dictionary)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u = self.norm(z)  # (B, n, d)
        alpha = self.alpha if self.alpha is not None else z.shape[-1] / (z.shape[-2] * self.precision**2)
        gain = 1 + 4 / (9 * (1 + alpha))  # eq. 86: the minimizer of the majorizer
        return F.relu(gain * (u @ self.dictionary) - 4 * self.lambd / (9 * alpha))  # eq. 87-88, 92


class ISTAMMArgs(Args):
    alpha: float | None = Field(
        default=None,
        gt=0,
        description="alpha of R(Z) = 1/2 logdet(I + alpha Z^*Z) (003 eq. 77). Default: its definition "
        "d / (N precision^2) for the d-dimensional tokens at hand (N of them); the paper treats it as a "
        "hyperparameter and reports no value.",
    )
    precision: float = Field(
        default=0.5, gt=0, description="Precision eps of the coding rate in alpha = d / (N eps^2) (used when alpha is not given)."
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
    update=lambda args: "ReLU((1 + 4/(9(1+α))) D*Z − 4λ/(9α))" + (",  Z ← LN Z" if args.norm else "")
    + ("" if args.alpha is not None else ",  α = d/(Nε²)"),
    description="Majorization-minimization sparsification step: ReLU of a scaled dictionary projection, no skip "
    "(ablation, 003 Table 3: 68.6% vs 70.8%).",
    inverse=TO_DICTIONARY,
    example=Example(args={"lambd": 0.1}, shape=(8, 16)),
    measure=sparsity_measures(),
)
def ista_mm(args: ISTAMMArgs, shape: Shape) -> nn.Module:
    return ISTAMM(
        token_dim(shape, "ista_mm"),
        alpha=args.alpha,
        precision=args.precision,
        lambd=args.lambd,
        norm=args.norm,
        eps=args.eps,
    )


# ------------------------------------------------------------------ overcomplete dictionary learning (CRATE-alpha)


class ISTAODL(Residual):
    """``x + ISTA_2(LN x | D) D1^T``: two non-negative ISTA steps from 0, overcomplete (CRATE-alpha).

    ``D`` (``dictionary``) and ``D1`` (``synthesis``; the authors' ``D`` and ``D1``) have shape
    ``(d, ratio*d)``; in rows, with ``u = LN(x)``::

        a1  = ReLU(eta u D - eta lambda)                      # first step from a = 0
        a2  = ReLU(a1 - eta (a1 D^T - u) D - eta lambda)      # second step
        out = x + a2 D1^T

    No inverse: the step's output is a token (the code is decoded by ``D1`` and added back), not a
    sparse code, so the ``dictionary`` synthesis that undoes ISTA (001 Listing 3) does not undo it,
    and no paper derives a decoder step for it.
    """

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        ratio: int = 4,
        step_size: float = 0.1,
        lambd: float = 0.1,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.step_size, self.lambd = step_size, lambd
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, ratio * dim))  # D
        self.synthesis = nn.Parameter(torch.empty(dim, ratio * dim))  # D1
        nn.init.kaiming_uniform_(self.dictionary)
        nn.init.kaiming_uniform_(self.synthesis)

    def code(self, x: torch.Tensor) -> torch.Tensor:
        """The sparse code ``a2`` of shape ``(B, n, ratio*d)`` (``LN`` applied here)."""
        eta, threshold = self.step_size, self.step_size * self.lambd
        u = self.norm(x)  # (B, n, d)
        a1 = F.relu(eta * (u @ self.dictionary) - threshold)  # (B, n, r*d)
        return F.relu(a1 - eta * ((a1 @ self.dictionary.t() - u) @ self.dictionary) - threshold)  # (B, n, r*d)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.code(x) @ self.synthesis.t()  # (B, n, d)


class ISTAODLArgs(Args):
    step_size: float = Field(default=0.1, gt=0, description="Step size eta of both ISTA steps.")
    lambd: float = Field(default=0.1, ge=0, description="Sparsity weight lambda.")
    ratio: int = Field(default=4, ge=1, description="Overcompleteness: the dictionaries have ratio * d atoms (CRATE-alpha: 4).")
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (CRATE-alpha: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (CRATE-alpha: 1e-6).")


@primitive(
    "ista_odl",
    args=ISTAODLArgs,
    kind="sparsify",
    objective="LASSO lambda ||A||_1 + 1/2 ||Z - D A||_F^2, A >= 0, overcomplete D (two proximal steps from 0)",
    equation="CRATE-alpha (Yang et al. 2024) Sec. 3; 003 eq. 17",
    update=lambda args: "Z + D₁A₂,  A₂ = ReLU(A₁ − ηDᵀ(DA₁ − U) − ηλ),  A₁ = ReLU(ηDᵀU − ηλ),  "
    + ("U = LN Z" if args.norm else "U = Z"),
    description="Overcomplete dictionary learning step of CRATE-alpha: two ISTA steps from 0, decoded by D1, residual.",
    example=Example(args={"ratio": 2}, shape=(8, 16)),
    # measured on the code a2 (recomputed from the input), not on the output, which adds the residual back
    measure=(
        *sparsity_measures(lambda module, inputs, output: module.code(inputs[0]), start=False),
        lasso_measure(lambda module, inputs, output: module.code(inputs[0]), start="zero"),
    ),
)
def ista_odl(args: ISTAODLArgs, shape: Shape) -> nn.Module:
    return ISTAODL(
        token_dim(shape, "ista_odl"),
        ratio=args.ratio,
        step_size=args.step_size,
        lambd=args.lambd,
        norm=args.norm,
        eps=args.eps,
    )
