"""Token statistics self-attention (TSSA): a gradient step on a variational coding rate, linear in n.

Book eq. 5.3.16-5.3.18 (ToST), as ToST's vision code computes it, in rows with ``x`` ``(B, n, d)``::

    w      = LN(x) W^T + b                       # W: Linear(d, d) with bias; K heads of p = d/K
    w_hat  = w / max(||w||_tokens, 1e-12)        # per head and feature, norm over the n tokens
    Pi[k, i] = softmax_k(temp_k * sum_j w_hat[k, i, j]^2)          # memberships, eq. 5.3.16-5.3.17
    m[k, j]  = sum_i Pi[k, i] w[k, i, j]^2 / (sum_i Pi[k, i] + 1e-8)  # second moments, eq. 5.3.10
    out[k, i, j] = -Pi[k, i] w[k, i, j] / (1 + m[k, j])              # -grad of R^var_c, eq. 5.3.18
    z      = x + concat_k(out_k) W_o^T + b_o

``1 / (1 + m)`` is ``grad f`` of ``f(x) = log(1 + x)`` at the second moment: the step descends the
variational compression term R^var_{c,f} (book eq. 5.3.8-5.3.13). No token-token products: time and
memory are linear in n. Parameter names are the authors' (``qkv`` is W, one projection; ``temp``;
``to_out`` is W_o), so their checkpoints load by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..probes import Objective, Reading, coding_rate_measure, variational_rate
from ..registry import Args, Example, Shape, primitive, token_dim
from ..residual import Residual


class TSSA(Residual):
    """``x + TSSA(LN x | W, temp)`` (book eq. 5.3.18; ToST's ``AttentionTSSA``)."""

    def __init__(self, dim: int, heads: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"tssa: token dimension {dim} is not divisible by heads={heads}")
        self.heads = heads
        self.norm = nn.LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, dim)  # W, b: the subspaces U_[K] (the authors' name)
        self.temp = nn.Parameter(torch.ones(heads, 1))  # 1/(2 eta) of eq. 5.3.17, learned per head
        self.to_out = nn.Linear(dim, dim)  # W_o, b_o

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w, pi, m)`` at tokens ``x`` (normalized here): projections ``(B, K, n, p)``, memberships
        ``(B, K, n)`` (eq. 5.3.16-5.3.17) and per-head second moments ``(B, K, 1, p)`` (eq. 5.3.10)."""
        w = self.qkv(self.norm(x)).unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, K, n, p)
        w_hat = F.normalize(w, dim=-2)  # unit norm over the tokens, eps 1e-12
        pi = torch.softmax(self.temp * w_hat.pow(2).sum(-1), dim=1)  # (B, K, n): softmax over heads
        m = (pi.unsqueeze(-2) @ w.pow(2)) / (pi.sum(-1)[..., None, None] + 1e-8)  # (B, K, 1, p)
        return w, pi, m

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, pi, m = self.statistics(x)
        out = -pi.unsqueeze(-1) * w / (1 + m)  # (B, K, n, p)
        return x, self.to_out(out.transpose(1, 2).flatten(2))  # (B, n, d)


class TSSAArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K (heads); p = d / K.")
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (ToST: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (ToST: 1e-6).")


@primitive(
    "tssa",
    args=TSSAArgs,
    kind="compress",
    objective="variational coding rate R^var_c(Z, Pi | U) from token statistics (descent), linear in n",
    equation="book eq. 5.3.8-5.3.18 (002 Sec. 5.3.2)",
    update=lambda args: "Z + TSSA(LN Z | U, Π)" if args.norm else "Z + TSSA(Z | U, Π)",
    description="Token statistics self-attention (ToST): compresses against K subspaces using per-head "
    "second moments instead of token-token attention.",
    example=Example(args={"heads": 2}, shape=(8, 16)),
    measure=(
        coding_rate_measure(
            "down",
            subspaces=lambda module: module.qkv.weight.t(),
            description="R^c(LN Z | U) against the step's projection W = U^T (its K heads; bias not counted)",
        ),
        Objective(
            "variational_rate",
            "down",
            lambda module, inputs, output, **_: Reading(
                variational_rate(*module.statistics(output)[:2]), variational_rate(*module.statistics(inputs[0])[:2])
            ),
            "R^var_c(Z, Π | U)",
            "ToST's variational coding rate with f = log(1 + x), memberships Pi from the step itself (book eq. 5.3.8)",
        ),
    ),
)
def tssa(args: TSSAArgs, shape: Shape) -> nn.Module:
    return TSSA(token_dim(shape, "tssa"), args.heads, norm=args.norm, eps=args.eps)
