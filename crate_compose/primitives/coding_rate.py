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

import torch
from pydantic import Field
from torch import nn

from ..probes import coding_rate_measure
from ..registry import Args, Example, Shape, primitive, token_dim
from ..residual import Residual
from .compress import head_dim_of
from .precision import LayerNorm


class CodingRateStep(Residual):
    """``x - kappa * grad R^c(LN x | U)``: one exact gradient step on the coding rate (003 eq. 9)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        precision: float = 0.5,
        kappa: float = 1.0,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.precision, self.kappa = heads, head_dim, precision, kappa
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]

    def gradient(self, u: torch.Tensor) -> torch.Tensor:
        """``grad_u R^c(u | U)`` of shape ``(B, n, d)`` for tokens ``u`` of shape ``(B, n, d)``."""
        n, p = u.shape[-2], self.head_dim
        a = p / (n * self.precision**2)
        w = self.subspaces(u).unflatten(-1, (self.heads, p)).transpose(1, 2)  # (B, K, n, p)
        solve_dtype = torch.promote_types(u.dtype, torch.float32)  # no LU in half precision
        wt = w.transpose(-1, -2).to(solve_dtype)  # (B, K, p, n)
        gram = torch.eye(p, dtype=solve_dtype, device=u.device) + a * wt @ wt.transpose(-1, -2)  # (B, K, p, p)
        # w (I + a w^T w)^{-1} = (gram^{-1} w^T)^T, gram being symmetric
        h = torch.linalg.solve(gram, wt).transpose(-1, -2).to(u.dtype)  # (B, K, n, p)
        return a * h.transpose(1, 2).flatten(2) @ self.subspaces.weight  # (B, n, d): sum_k h_k U_k^T

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, -self.kappa * self.gradient(self.norm(x))


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
    update=lambda args: "Z − κ a Σ_k U_k U_kᵀZ (I + a (U_kᵀZ)ᵀU_kᵀZ)⁻¹,  a = p/(Nε²)"
    + (",  gradient at LN Z" if args.norm else ""),
    description="Exact gradient step on the coding rate against K subspaces (what MSSA approximates).",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    measure=coding_rate_measure("down", description="R^c(LN Z | U), the objective the step is an exact gradient step on"),
)
def coding_rate_step(args: CodingRateArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "coding_rate_step")
    return CodingRateStep(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        precision=args.precision,
        kappa=args.kappa,
        norm=args.norm,
        eps=args.eps,
    )
