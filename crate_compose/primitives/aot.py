"""The attention-only transformer (AoT) step: unrolled subspace denoising (book eq. 5.3.2, Sec. 5.3.1).

Book eq. 5.3.2, tokens as columns of ``Z`` (``d x N``)::

    Z+ = Z + eta * sum_k U_k U_k^T Z phi(Z^T U_k U_k^T Z)

``phi`` acts on each column (one query token): ``softmax``, or, in Theorem 5.1,
``phi = h(softmax(.))`` with ``h(x) = tau`` where ``x > tau`` and ``0`` elsewhere. In rows, with
``u = LN(x)`` (or ``x``) and ``w_k = u U_k`` of shape ``(n, p)``::

    h_k = phi(scale * w_k w_k^T) w_k        # phi row by row; the matrix is symmetric
    z   = x + eta * concat_k(h_k) U^T        # AoT-MSSA: the output goes back through U itself

``scale`` is 1 in eq. 5.3.2 (CRATE's MSSA uses ``p^-1/2``). Theorem 5.1: for tokens from eq. 5.3.1
on orthonormal subspaces, ``p >~ log N``, noise ``delta <~ sqrt(log N / p)`` and
``1/2 < tau <= 1 / (1 + N exp(-9p/32))``, each step multiplies every subspace's SNR (eq. 5.3.3) by
``1 + eta tau`` with high probability. With ``tau > 1/2`` at most one entry per row survives.

``variant: mhsa`` (AoT-MHSA) replaces the shared ``U`` by separate projections, without biases,
so the update stays eq. 5.3.2's form: ``h_k = phi(scale * q_k k_k^T) v_k``, ``z = x + eta concat_k(h_k) O^T``.
The book adds LayerNorm before the attention only for language tasks (``norm: false`` by default).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..probes import coding_rate_measure
from ..registry import Args, Example, Shape, primitive, token_dim
from ..residual import Residual
from .compress import head_dim_of
from .precision import LayerNorm, float32, softmax


class AoT(Residual):
    """``x + eta * sum_k U_k U_k^T Z phi(Z^T U_k U_k^T Z)`` (book eq. 5.3.2), as a residual step."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        variant: Literal["mssa", "mhsa"] = "mssa",
        phi: Literal["softmax", "threshold"] = "softmax",
        tau: float = 0.6,
        scale: float = 1.0,
        step_size: float = 1.0,
        norm: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.variant, self.phi = heads, head_dim, variant, phi
        self.tau, self.scale, self.step_size = tau, scale, step_size
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        if variant == "mssa":
            self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]
        else:
            self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)  # Q, K, V
            self.out = nn.Linear(heads * head_dim, dim, bias=False)  # O

    def weights(self, scores: torch.Tensor) -> torch.Tensor:
        """``phi`` applied to each query's row of scores ``(B, K, n, n)``."""
        attn = softmax(scores, dim=-1)  # float32 for half builds
        if self.phi == "threshold":  # h(x) = tau if x > tau else 0 (Theorem 5.1)
            attn = torch.where(attn > self.tau, torch.full_like(attn, self.tau), torch.zeros_like(attn))
        return attn

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = self.norm(x)  # (B, n, d)
        if self.variant == "mssa":
            w = self.subspaces(u).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (B, K, n, p)
            q = k = v = w
            back = self.subspaces.weight  # (K*p, d): h @ U^T in rows
        else:
            qkv = self.qkv(u).unflatten(-1, (3, self.heads, self.head_dim))  # (B, n, 3, K, p)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, K, n, p)
            back = self.out.weight.t()  # (K*p, d)
        scores = self.scale * float32(q) @ float32(k).transpose(-1, -2)  # (B, K, n, n), float32 for half builds
        h = self.weights(scores).to(v.dtype) @ v  # (B, K, n, p)
        return x, self.step_size * (h.transpose(1, 2).flatten(2) @ back)  # (B, n, d)


class AoTArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K (heads).")
    head_dim: int | None = Field(default=None, ge=1, description="Subspace dimension p; default d / heads.")
    variant: Literal["mssa", "mhsa"] = Field(
        default="mssa",
        description="'mssa': one shared U, output back through U (AoT-MSSA, eq. 5.3.2); "
        "'mhsa': separate Q/K/V/O projections without biases (AoT-MHSA).",
    )
    phi: Literal["softmax", "threshold"] = Field(
        default="softmax",
        description="'softmax' over each query's scores; 'threshold': h(softmax) with h(x) = tau where x > tau, "
        "else 0 (Theorem 5.1).",
    )
    tau: float = Field(
        default=0.6,
        gt=0,
        lt=1,
        description="Threshold tau of phi = threshold; Theorem 5.1 needs 1/2 < tau <= 1/(1 + N exp(-9p/32)).",
    )
    scale: float = Field(
        default=1.0, gt=0, description="Factor on the scores Z^T U_k U_k^T Z: 1 in eq. 5.3.2; CRATE's MSSA uses p^-1/2."
    )
    step_size: float = Field(default=1.0, gt=0, description="Step size eta.")
    norm: bool = Field(
        default=False, description="LayerNorm before the attention (the book uses it only for language tasks)."
    )
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (when norm is true).")


def _update(args: AoTArgs) -> str:
    phi = "h_τ(softmax(·))" if args.phi == "threshold" else "softmax"
    z, zt = ("LN Z", "(LN Z)ᵀ") if args.norm else ("Z", "Zᵀ")
    if args.variant == "mhsa":
        return f"Z + η Σ_k O_k V_kᵀ{z} φ({zt}K_k Q_kᵀ{z}),  φ = {phi}"
    return f"Z + η Σ_k U_k U_kᵀ{z} φ({zt}U_k U_kᵀ{z}),  φ = {phi}"


@primitive(
    "aot",
    args=AoTArgs,
    kind="compress",
    objective="denoising against K subspaces: raises each subspace's SNR (book eq. 5.3.3, Theorem 5.1); "
    "an approximate descent step on R^c",
    equation="book eq. 5.3.2, Theorem 5.1 (002 Sec. 5.3.1)",
    update=_update,
    description="Attention-only transformer layer: self-attention with the output tied to U and a skip, no MLP.",
    example=Example(args={"heads": 2, "step_size": 0.5}, shape=(8, 16)),
    # AoT-MSSA compresses against its shared U; AoT-MHSA has no shared subspaces (separate Q, K, V): no reading
    measure=coding_rate_measure(
        "down",
        subspaces=lambda module: module.subspaces.weight.t() if module.variant == "mssa" else None,
        description="R^c(Z | U) against the step's own U (variant mssa only; mhsa has no shared subspaces)",
    ),
)
def aot(args: AoTArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "aot")
    return AoT(
        dim,
        args.heads,
        head_dim_of(args.heads, args.head_dim, dim),
        variant=args.variant,
        phi=args.phi,
        tau=args.tau,
        scale=args.scale,
        step_size=args.step_size,
        norm=args.norm,
        eps=args.eps,
    )
