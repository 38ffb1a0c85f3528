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

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..decoding import DecodingError
from ..probes import Objective, Reading, coding_rate_measure, variational_rate
from ..registry import Args, Example, Shape, primitive, token_dim
from ..residual import Residual
from .precision import LayerNorm, float32, softmax


class TSSA(Residual):
    """``x + TSSA(LN x | W, temp)`` (book eq. 5.3.18; ToST's ``AttentionTSSA``)."""

    def __init__(self, dim: int, heads: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"tssa: token dimension {dim} is not divisible by heads={heads}")
        self.heads = heads
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, dim)  # W, b: the subspaces U_[K] (the authors' name)
        self.temp = nn.Parameter(torch.ones(heads, 1))  # 1/(2 eta) of eq. 5.3.17, learned per head
        self.to_out = nn.Linear(dim, dim)  # W_o, b_o

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w, pi, m)`` at tokens ``x`` (normalized here): projections ``(B, K, n, p)``, memberships
        ``(B, K, n)`` (eq. 5.3.16-5.3.17) and per-head second moments ``(B, K, 1, p)`` (eq. 5.3.10).
        The memberships and moments are float32 in half-precision builds."""
        w = self.qkv(self.norm(x)).unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, K, n, p)
        w32 = float32(w)
        w_hat = F.normalize(w32, dim=-2)  # unit norm over the tokens, eps 1e-12
        pi = softmax(self.temp * w_hat.pow(2).sum(-1), dim=1)  # (B, K, n): softmax over heads
        m = (pi.unsqueeze(-2) @ w32.pow(2)) / (pi.sum(-1)[..., None, None] + 1e-8)  # (B, K, 1, p)
        return w, pi, m

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, pi, m = self.statistics(x)
        out = (-pi.unsqueeze(-1) * w / (1 + m)).to(w.dtype)  # (B, K, n, p)
        return x, self.to_out(out.transpose(1, 2).flatten(2))  # (B, n, d)


class CausalTSSA(TSSA):
    """``x + TSSA_causal(LN x | W, temp, beta)``: every statistic a running sum over earlier positions
    (book exercise 5.6; ToST's language model). ``beta`` (the authors' ``denom_bias``) is ``(K, N, 1)``
    for a context of N tokens; shorter sequences use its first rows."""

    def __init__(self, dim: int, heads: int, context: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__(dim, heads, norm=norm, eps=eps)
        self.denom_bias = nn.Parameter(torch.zeros(heads, context, 1))  # beta[k, t], init 0

    def scan(self, w: torch.Tensor, state: tuple | None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Memberships ``(B, K, s)`` and second moments ``(B, K, s, p)`` of new projections ``w``
        ``(B, K, s, p)``, continuing the running sums in ``state`` (None: a sequence's start)."""
        b, k, s, p = w.shape
        w = float32(w)  # the running sums are float32 in half-precision builds
        if state is None:
            zeros = w.new_zeros(b, k, p)
            state = (zeros, w.new_zeros(b, k), zeros, 0)
        energy, mass, moment, start = state  # sum w^2, sum Pi, sum Pi w^2, tokens seen
        if start + s > self.denom_bias.shape[1]:
            raise DecodingError(f"causal tssa holds positions for {self.denom_bias.shape[1]} tokens; got {start + s}")
        w_sq = w.pow(2)
        energy = energy.unsqueeze(-2) + w_sq.cumsum(-2)  # sum_{s<=t} w^2
        q = w_sq / energy.clamp_min(1e-12) + self.denom_bias[:, start : start + s]
        pi = softmax(self.temp * q.sum(-1), dim=1)  # (B, K, s): softmax over the heads
        moment = moment.unsqueeze(-2) + (w_sq * pi.unsqueeze(-1)).cumsum(-2)
        mass = mass.unsqueeze(-1) + pi.cumsum(-1)
        m = moment / (mass + 1e-8).unsqueeze(-1)
        return pi, m, (energy[..., -1, :], mass[..., -1], moment[..., -1, :], start + s)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(self.norm(x)).unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, K, n, p)

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = self.project(x)
        pi, m, _ = self.scan(w, None)
        return w, pi, m

    def _branch(self, w: torch.Tensor, pi: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        out = (-pi.unsqueeze(-1) * w / (1 + m)).to(w.dtype)
        return self.to_out(out.transpose(1, 2).flatten(2))

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self._branch(*self.statistics(x))

    def decode(self, x: torch.Tensor, state: tuple | None) -> tuple[torch.Tensor, tuple]:
        """New tokens ``x`` given the running sums of earlier ones: O(d) work per token at any position."""
        w = self.project(x)
        pi, m, state = self.scan(w, state)
        return self.combine(x, self._branch(w, pi, m)), state


class TSSAArgs(Args):
    heads: int = Field(ge=1, description="Number of subspaces K (heads); p = d / K.")
    causal: bool = Field(
        default=False,
        description="Running sums over earlier positions instead of statistics over all tokens (book exercise "
        "5.6; ToST's language model), with a learned (K, N, 1) position bias for a context of N tokens.",
    )
    norm: bool = Field(default=True, description="Apply LayerNorm before the step (ToST: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (ToST: 1e-6).")


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
    dim = token_dim(shape, "tssa")
    if args.causal:
        return CausalTSSA(dim, args.heads, shape[0], norm=args.norm, eps=args.eps)
    return TSSA(dim, args.heads, norm=args.norm, eps=args.eps)
