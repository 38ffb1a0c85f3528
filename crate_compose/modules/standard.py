"""The modules of :mod:`crate_compose.primitives.standard`: standard attention and MLP, for baselines.

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .causal import Growing, attention_weights, causal_attention, softmax_attention
from .precision import LayerNorm
from .residual import Residual


class MHSA(Residual):
    """``x + MHSA(LN x)``: multi-head self-attention with separate Q/K/V projections."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = True,
        causal: bool = False,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, head_dim, causal
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=qkv_bias)
        self.out = nn.Linear(heads * head_dim, dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values ``(B, K, n, p)`` of the normalized tokens."""
        qkv = self.qkv(self.norm(x)).unflatten(-1, (3, self.heads, self.head_dim))  # (B, n, 3, K, p)
        return tuple(qkv.permute(2, 0, 3, 1, 4))  # type: ignore[return-value]

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """``softmax(q_k k_k^T / sqrt(p))`` per head, ``(B, K, n, n)``, at the step's input ``x``: the
        weights :meth:`split` applies to the values (fused there, written out here)."""
        q, k, _ = self.project(x)
        return attention_weights(q, k, causal=self.causal)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.project(x)
        h = softmax_attention(q, k, v, causal=self.causal)  # softmax(q k^T / sqrt p) v, fused
        return x, self.out(h.transpose(1, 2).flatten(2))

    def decode(self, x: torch.Tensor, cache: tuple[Growing, Growing] | None):
        """Causal attention on new tokens given cached keys and values of earlier ones: two caches."""
        keys, values = cache or (Growing(), Growing())
        q, k, v = self.project(x)
        h = causal_attention(q, keys.extend(k), values.extend(v))
        return self.combine(x, self.out(h.transpose(1, 2).flatten(2))), (keys, values)


class MLP(Residual):
    """``x + W_2 GELU(W_1 LN x)``."""

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self, dim: int, hidden: int, *, norm: bool = True, eps: float = 1e-5, gelu: str = "none", bias: bool = True
    ) -> None:
        super().__init__()
        self.gelu = gelu
        self.norm = LayerNorm(dim, eps=eps, bias=bias) if norm else nn.Identity()
        self.expand = nn.Linear(dim, hidden, bias=bias)
        self.contract = nn.Linear(hidden, dim, bias=bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.contract(F.gelu(self.expand(self.norm(x)), approximate=self.gelu))  # (B, n, d)
