"""Sparsification: a proximal step on a LASSO against a dictionary D (the MLP of CRATE).

ISTA as CRATE implements it (paper 003 eq. 17, Algorithm 3 "FeedForward"), in rows::

    u   = LN(z)
    out = ReLU(u + eta * (u D - (u D^T) D) - eta * lambda)

one non-negative ISTA step from ``u``; the layer output is ``out`` (no residual). The paper's code
uses three matrix products; ``u D - (u D^T) D = (u - u D^T) D`` needs two.
The soft-threshold variant (003 eq. 116-117) replaces ReLU(. - eta lambda) by the two-sided
S_{eta lambda}.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..registry import Args, Inverse, Shape, primitive, token_dim


class ISTA(nn.Module):
    """``ISTA(LN z | D)``: one proximal-gradient step on ``lambda ||x||_1 + 1/2 ||z - D x||^2`` (003 eq. 17)."""

    def __init__(
        self,
        dim: int,
        *,
        step_size: float = 0.1,
        lambd: float = 0.1,
        threshold: str = "relu",
        norm: bool = True,
    ) -> None:
        super().__init__()
        self.step_size, self.lambd, self.threshold = step_size, lambd, threshold
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()
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


# 001 Listing 3: the sparse code is undone by a learned dictionary, LN(x) E^T.
TO_DICTIONARY = Inverse("dictionary", lambda args, shape: {"norm": args.norm})


def _ista(threshold: str):
    def factory(args: ISTAArgs, shape: Shape) -> nn.Module:
        dim = token_dim(shape, "ista")
        return ISTA(dim, step_size=args.step_size, lambd=args.lambd, threshold=threshold, norm=args.norm)

    return factory


primitive(
    "ista",
    args=ISTAArgs,
    kind="sparsify",
    objective="LASSO lambda ||X||_1 + 1/2 ||Z - D X||_F^2, X >= 0 (proximal step)",
    equation="003 eq. 17; Alg. 3",
    update="ReLU(Z + ηDᵀ(Z − DZ) − ηλ),  Z ← LN Z",
    description="Non-negative ISTA step: sparse-codes tokens against a complete dictionary D.",
    inverse=TO_DICTIONARY,
)(_ista("relu"))

primitive(
    "ista_soft",
    args=ISTAArgs,
    kind="sparsify",
    objective="LASSO lambda ||X||_1 + 1/2 ||Z - D X||_F^2 (proximal step)",
    equation="003 eq. 116-117",
    update="S_ηλ(Z + ηDᵀ(Z − DZ)),  Z ← LN Z",
    description="Two-sided soft-threshold ISTA step (ablation, 003 App. B.5: 67.6% vs 70.8%).",
    inverse=TO_DICTIONARY,
)(_ista("soft"))
