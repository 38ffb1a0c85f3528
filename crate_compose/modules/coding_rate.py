"""The modules of :mod:`crate_compose.primitives.coding_rate`: the exact coding-rate gradient step (003 eq. 7-9).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
from torch import nn

from .precision import LayerNorm, linear_layout
from .residual import Residual


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
        w = self.subspaces(u).unflatten(-1, (self.heads, p)).transpose(1, 2).contiguous()  # (B, K, n, p), a batch of
        # matrices (w^T w is then one batched product of a transposed view and w, the layout half products want)
        solve_dtype = torch.promote_types(u.dtype, torch.float32)  # no LU in half precision
        wt = w.transpose(-1, -2).to(solve_dtype)  # (B, K, p, n)
        gram = torch.eye(p, dtype=solve_dtype, device=u.device) + a * (wt @ wt.transpose(-1, -2))  # (B, K, p, p)
        # w (I + a w^T w)^{-1} = (gram^{-1} w^T)^T, gram being symmetric
        h = torch.linalg.solve(gram, wt).transpose(-1, -2).to(u.dtype)  # (B, K, n, p)
        return a * h.transpose(1, 2).flatten(2) @ linear_layout(self.subspaces.weight)  # (B, n, d): sum_k h_k U_k^T

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, -self.kappa * self.gradient(self.norm(x))
