"""Token statistics self-attention (TSSA): a gradient step on a variational coding rate, linear in n.

Book eq. 5.3.16-5.3.18 (ToST), as ToST's vision code computes it, in rows with ``x`` ``(B, n, d)``::

    w      = LN(x) W^T + b                       # W: Linear(d, d) with bias; K heads of p = d/K
    w_hat  = w / max(||w||_tokens, 1e-12)        # per head and feature, norm over the n tokens
    Pi[k, i] = softmax_k(temp_k * sum_j w_hat[k, i, j]^2)          # memberships, eq. 5.3.16-5.3.17
    m[k, j]  = sum_i Pi[k, i] w[k, i, j]^2 / (sum_i Pi[k, i] + 1e-8)  # second moments, eq. 5.3.10
    out[k, i, j] = -Pi[k, i] w[k, i, j] / (1 + m[k, j])              # -grad of R^var_c, eq. 5.3.18
    z      = x + concat_k(out_k) W_o^T + b_o

Causal TSSA (book exercise 5.6), as ToST's language model computes it: every statistic becomes a
running sum over positions ``s <= t``, with a learned bias ``beta[k, t]`` per head and position::

    q[k, t, j] = w[k, t, j]^2 / max(sum_{s<=t} w[k, s, j]^2, 1e-12) + beta[k, t]
    Pi[k, t]   = softmax_k(temp_k * sum_j q[k, t, j])
    m[k, t, j] = sum_{s<=t} Pi[k, s] w[k, s, j]^2 / (sum_{s<=t} Pi[k, s] + 1e-8)
    out[k, t, j] = -Pi[k, t] w[k, t, j] / (1 + m[k, t, j])

The three sums and the position are the whole state of cached decoding: constant in size, so one
more token costs the same at any context length (the authors' code recomputes ``cumsum`` over the
whole sequence at every token).

``1 / (1 + m)`` is ``grad f`` of ``f(x) = log(1 + x)`` at the second moment: the step descends the
variational compression term R^var_{c,f} (book eq. 5.3.8-5.3.13). No token-token products: time and
memory are linear in n. Parameter names are the authors' (``qkv`` is W, one projection; ``temp``;
``to_out`` is W_o), so their checkpoints load by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn


class TSSAArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K (heads); p = d / K.")
    causal: bool = Field(
        default=False,
        description="Running sums over earlier positions instead of statistics over all tokens (book exercise "
        "5.6; ToST's language model), with a learned (K, N, 1) position bias for a context of N tokens.",
    )
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (ToST: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (ToST: 1e-6).")
    biases: bool = Field(
        default=True,
        description="Biases in the projections and the LayerNorm (nanoGPT's `bias`; "
        "the ToST language models were trained without: false).",
    )


@primitive(
    "tssa",
    args=TSSAArgs,
    kind="compress",
    objective="variational coding rate R^var_c(Z, Pi | U) from token statistics (descent), linear in n",
    equation="book eq. 5.3.8-5.3.18 (002 Sec. 5.3.2)",
    update=lambda args: f"Z + TSSA{'_causal' if args.causal else ''}({'LN Z' if args.norm else 'Z'} | U, Π)",
    description="Token statistics self-attention (ToST): compresses against K subspaces using per-head "
    "second moments instead of token-token attention.",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    measure=lambda: _measures(),
    footprint=lambda args, shape, context: _footprint(args, shape),
)
def tssa(args: TSSAArgs, shape: Shape) -> nn.Module:
    from ..modules.tssa import TSSA, CausalTSSA

    dim = shape[-1]
    if args.causal:
        return CausalTSSA(dim, args.heads, shape[0], norm=args.norm, eps=args.eps, bias=args.biases)
    return TSSA(dim, args.heads, norm=args.norm, eps=args.eps, bias=args.biases)


def _footprint(args: TSSAArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)``: ``LN(d)``, ``W: d -> d``, ``temp: (K, 1)``, ``W_o: d -> d``, and when causal the
    position bias ``beta: (K, n, 1)``; residual."""
    dim = token_dim(shape, "tssa")
    if dim % args.heads:
        raise ValueError(f"tssa: token dimension {dim} is not divisible by heads={args.heads}")
    parameters = {
        **layernorm("norm", dim, present=args.norm, bias=args.biases),
        **linear("qkv", dim, dim, bias=args.biases),
        "temp": (args.heads, 1),
        **linear("to_out", dim, dim, bias=args.biases),
    }
    if args.causal:
        parameters["denom_bias"] = (args.heads, shape[0], 1)
    return Footprint(shape, parameters, residual=True)


def _measures():
    from ..modules.measures import Measure, Reading, coding_rate_measure, variational_rate

    return (
        coding_rate_measure(
            "down",
            subspaces=lambda module: module.qkv.weight.t(),
            description="R^c(LN Z | U) against the step's projection W = U^T (its K heads; bias not counted)",
        ),
        Measure(
            "variational_rate",
            "down",
            lambda module, inputs, output, **_: Reading(
                variational_rate(*module.statistics(output)[:2]), variational_rate(*module.statistics(inputs[0])[:2])
            ),
            "R^var_c(Z, Π | U)",
            "ToST's variational coding rate with f = log(1 + x), memberships Pi from the step itself (book eq. 5.3.8)",
        ),
    )
