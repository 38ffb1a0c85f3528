"""Denoising against a mixture of subspaces: Tweedie's formula, per token (003 eq. 6).

For tokens drawn from a mixture of K Gaussians on subspaces ``U_k`` (``d x p``) plus noise of
variance ``sigma^2``, the posterior mean of the clean token is, per token ``z`` (columns)::

    z+ = [U_1 .. U_K] (diag(softmax_k(||U_k^T z||^2 / (2 sigma^2))) (x) I_p) [U_1^T z; ..; U_K^T z]

i.e. each token is projected onto every subspace and the projections are averaged with the
posterior memberships. No token interacts with another (this is the *per-token* operator that
MSSA's attention generalizes, 003 Sec. 2.3) and there is no residual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .compress import head_dim_of, subspace_parameters

if TYPE_CHECKING:
    from torch import nn


class DenoiseArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K.")
    head_dim: int | None = Field(default=None, ge=1, description="Subspace dimension p; default d / heads.")
    sigma: float = Field(
        default=1.0, gt=0, description="Noise level sigma of the mixture model (softmax temperature 2 sigma^2)."
    )
    norm: bool = Field(default=False, description="Apply LayerNorm before the step (eq. 6 has none).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (when norm is true).")


@primitive(
    "denoise",
    args=DenoiseArgs,
    kind="denoise",
    objective="posterior mean E[z_clean | z] under a mixture of subspace Gaussians (Tweedie's formula)",
    equation="003 eq. 6",
    update=lambda args: "Σ_k U_k softmax_k(‖U_kᵀZ‖² / 2σ²) U_kᵀZ" + (",  Z ← LN Z" if args.norm else ""),
    description="Subspace denoiser: projects each token onto K subspaces and averages with posterior memberships.",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    measure=lambda: _measure(),
    footprint=lambda args, shape, context: Footprint(shape, subspace_parameters(args, token_dim(shape, "denoise"))),
)
def denoise(args: DenoiseArgs, shape: Shape) -> nn.Module:
    from ..modules.denoise import SubspaceDenoiser

    dim = shape[-1]
    return SubspaceDenoiser(
        dim, args.heads, head_dim_of(args.heads, args.head_dim, dim), sigma=args.sigma, norm=args.norm, eps=args.eps
    )


def _measure():
    from ..modules.measures import Measure, Reading, subspace_residual

    return Measure(
        "subspace_residual",
        "down",
        lambda module, inputs, output, **_: Reading(
            subspace_residual(output, module.subspaces.weight.t(), module.heads),
            subspace_residual(module.norm(inputs[0]), module.subspaces.weight.t(), module.heads),
        ),
        "min_k ‖(I − P_k) z‖ / ‖z‖",
        "mean relative distance of the tokens to their nearest subspace span(U_k) (what eq. 6 reduces)",
    )
