"""The exact coding-rate gradient step, the quantity MSSA approximates (003 eq. 7-9; book eq. 5.2.9).

With ``R^c(Z | U) = 1/2 sum_k logdet(I + a (U_k^T Z)^T (U_k^T Z))`` and ``a = p / (N eps^2)``,
003 eq. 9 gives (columns) ``grad R^c = a sum_k U_k U_k^T Z (I_N + a (U_k^T Z)^T (U_k^T Z))^{-1}``.
In rows, with ``u = LN(x)`` (or ``x``) of shape ``(n, d)`` and ``w_k = u U_k`` of shape ``(n, p)``::

    grad = a * sum_k (I_n + a w_k w_k^T)^{-1} w_k U_k^T
         = a * sum_k w_k (I_p + a w_k^T w_k)^{-1} U_k^T      # push-through identity
    z    = x - kappa * grad

The papers write the ``n x n`` inverse, cubic in n. The second line is the same matrix (exactly,
not an approximation) and is what is computed: a batched ``p x p`` solve per head, so the cost is
``O(K (n p^2 + p^3))``, linear in n; it still builds no attention. MSSA replaces the inverse by
a softmax (003 eq. 10-12); this step is for small models and for checking that approximation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .compress import head_dim_of, subspace_parameters

if TYPE_CHECKING:
    from torch import nn


class CodingRateArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K.")
    head_dim: int | None = Field(default=None, ge=1, description="Subspace dimension p; default d / heads.")
    precision: float = Field(
        default=0.5, gt=0, description="Precision eps of the coding rate: a = p / (N eps^2) (003 eq. 7)."
    )
    kappa: float = Field(default=1.0, gt=0, description="Step size kappa of the gradient step (003 eq. 10).")
    norm: bool = Field(default=True, description="Take the gradient at LN(x) (as CRATE's MSSA) instead of x.")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon.")


@primitive(
    "coding_rate_step",
    args=CodingRateArgs,
    kind="compress",
    objective="coding rate R^c(Z | U) = 1/2 sum_k logdet(I + p/(N eps^2) (U_k^T Z)^T U_k^T Z) (descent)",
    equation="003 eq. 7-9; book eq. 5.2.9",
    update=lambda args: (
        "Z − κ a Σ_k U_k U_kᵀZ (I + a (U_kᵀZ)ᵀU_kᵀZ)⁻¹,  a = p/(Nε²)" + (",  gradient at LN Z" if args.norm else "")
    ),
    description="Exact gradient step on the coding rate against K subspaces (what MSSA approximates).",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    measure=lambda: _measure(),
    footprint=lambda args, shape, context: Footprint(
        shape, subspace_parameters(args, token_dim(shape, "coding_rate_step")), residual=True
    ),
)
def coding_rate_step(args: CodingRateArgs, shape: Shape) -> nn.Module:
    from ..modules.coding_rate import CodingRateStep

    dim = shape[-1]
    return CodingRateStep(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        precision=args.precision,
        kappa=args.kappa,
        norm=args.norm,
        eps=args.eps,
    )


def _measure():
    from ..modules.measures import coding_rate_measure

    return coding_rate_measure("down", description="R^c(LN Z | U), the objective the step is an exact gradient step on")
