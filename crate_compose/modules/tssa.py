"""The modules of :mod:`crate_compose.primitives.tssa`: token statistics self-attention (book eq. 5.3.16-5.3.18).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .causal import DecodingError
from .precision import LayerNorm, float32, softmax
from .residual import Residual


class TSSA(Residual):
    """``x + TSSA(LN x | W, temp)`` (book eq. 5.3.18; ToST's ``AttentionTSSA``)."""

    def __init__(self, dim: int, heads: int, *, norm: bool = True, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.heads = heads  # d divides by heads (the footprint checks)
        self.norm = LayerNorm(dim, eps=eps, bias=bias) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, dim, bias=bias)  # W, b: the subspaces U_[K] (the authors' name)
        self.temp = nn.Parameter(torch.ones(heads, 1))  # 1/(2 eta) of eq. 5.3.17, learned per head
        self.to_out = nn.Linear(dim, dim, bias=bias)  # W_o, b_o

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

    def membership(self, x: torch.Tensor) -> torch.Tensor:
        """The memberships ``Pi`` ``(B, K, n)`` at the step's input ``x`` (a softmax over the heads):
        the ``pi`` of :meth:`statistics`, which the forward uses."""
        return self.statistics(x)[1]

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, pi, m = self.statistics(x)
        out = (-pi.unsqueeze(-1) * w / (1 + m)).to(w.dtype)  # (B, K, n, p)
        return x, self.to_out(out.transpose(1, 2).flatten(2))  # (B, n, d)


class CausalTSSA(TSSA):
    """``x + TSSA_causal(LN x | W, temp, beta)``: every statistic a running sum over earlier positions
    (book exercise 5.6; ToST's language model). ``beta`` (the authors' ``denom_bias``) is ``(K, N, 1)``
    for a context of N tokens; shorter sequences use its first rows."""

    def __init__(
        self, dim: int, heads: int, context: int, *, norm: bool = True, eps: float = 1e-5, bias: bool = True
    ) -> None:
        super().__init__(dim, heads, norm=norm, eps=eps, bias=bias)
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
