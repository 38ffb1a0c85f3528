"""The modules of :mod:`crate_compose.primitives.denoise`: the subspace denoiser (003 eq. 6).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
from torch import nn

from .precision import LayerNorm, float32, linear_layout, softmax


class SubspaceDenoiser(nn.Module):
    """``sum_k U_k softmax_k(||U_k^T z||^2 / (2 sigma^2)) U_k^T z`` for every token (003 eq. 6)."""

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self, dim: int, heads: int, head_dim: int, *, sigma: float = 1.0, norm: bool = False, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.sigma = heads, head_dim, sigma
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.subspaces(self.norm(x)).unflatten(-1, (self.heads, self.head_dim))  # (B, n, K, p): U_k^T z
        pi = softmax(float32(w).pow(2).sum(-1) / (2 * self.sigma**2), dim=-1).to(w.dtype)  # (B, n, K) memberships
        return (pi.unsqueeze(-1) * w).flatten(2) @ linear_layout(
            self.subspaces.weight
        )  # (B, n, d): sum_k U_k pi_k U_k^T z
