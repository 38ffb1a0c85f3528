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

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .compress import head_dim_of
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn


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
    measure=lambda: _measure(),
    footprint=lambda args, shape, context: _footprint(args, shape),
)
def aot(args: AoTArgs, shape: Shape) -> nn.Module:
    from ..modules.aot import AoT

    dim = shape[-1]
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


def _footprint(args: AoTArgs, shape: Shape) -> Footprint:
    """On tokens ``(n, d)``: ``U: d -> K*p`` (mssa) or ``Q, K, V: d -> 3K*p`` and ``O: K*p -> d``
    (mhsa), all without bias, and ``LN(d)`` when normalized; residual, same shape out."""
    dim = token_dim(shape, "aot")
    width = args.heads * head_dim_of(args.heads, args.head_dim, dim)
    parameters = layernorm("norm", dim, present=args.norm)
    if args.variant == "mssa":
        parameters.update(linear("subspaces", dim, width, bias=False))
    else:
        parameters.update({**linear("qkv", dim, 3 * width, bias=False), **linear("out", width, dim, bias=False)})
    return Footprint(shape, parameters, residual=True)


def _measure():
    from ..modules.measures import coding_rate_measure

    # AoT-MSSA compresses against its shared U; AoT-MHSA has no shared subspaces (separate Q, K, V): no reading
    return coding_rate_measure(
        "down",
        subspaces=lambda module: module.subspaces.weight.t() if module.variant == "mssa" else None,
        description="R^c(Z | U) against the step's own U (variant mssa only; mhsa has no shared subspaces)",
    )
