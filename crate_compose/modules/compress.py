"""The modules of :mod:`crate_compose.primitives.compress`: MSSA, the compression step (003 eq. 10-12, 115).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .causal import DecodingError, Growing, attention_weights, causal_attention, softmax_attention
from .precision import LayerNorm, linear_layout
from .residual import Residual


class MSSA(Residual):
    """``x + MSSA(LN x | U)``: one step of gradient descent on R^c (003 eq. 10-12, 115).

    Shapes: ``x`` is ``(B, n, d)``; ``U`` maps ``d -> K*p``; heads are ``(B, K, n, p)``.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        output: Literal["learned", "tied"] = "learned",
        bias: bool = True,
        causal: bool = False,
        step_size: float = 1.0,
        norm: bool = True,
        eps: float = 1e-5,
        kappa: float | None = None,
        rate_eps: float = 0.5,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal, self.step_size = heads, head_dim, causal, step_size
        self.kappa, self.rate_eps = kappa, rate_eps
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.subspaces = nn.Linear(dim, heads * head_dim, bias=False)  # U = [U_1 .. U_K]
        self.out = nn.Linear(heads * head_dim, dim, bias=bias) if output == "learned" else None

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        """``U_k^T x`` for every head: ``(B, K, n, p)``; ``x`` already normalized."""
        return self.subspaces(x).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """``concat_k SSA(x | U_k)`` of shape ``(B, n, K*p)``; ``x`` already normalized."""
        w = self.heads_of(x)  # (B, K, n, p)
        h = softmax_attention(w, w, w, causal=self.causal)  # softmax(w w^T p^-1/2) w, fused
        return h.transpose(1, 2).flatten(2)  # (B, n, K*p)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """``softmax(w_k w_k^T / sqrt(p))`` per head, ``(B, K, n, n)``, at the step's input ``x``
        (normalized here): the weights :meth:`attend` applies to ``w_k`` (fused there, written out
        here; ``tests/test_pictures.py`` recomputes the step's output from them)."""
        w = self.heads_of(self.norm(x))
        return attention_weights(w, w, causal=self.causal)

    def decode(self, x: torch.Tensor, cache: Growing | None) -> tuple[torch.Tensor, Growing]:
        """Causal MSSA on new tokens ``x`` given the cached ``U^T z`` of earlier ones (book eq. 5.3.26-5.3.31):
        one cache, as query = key = value."""
        if self.kappa is not None:
            raise DecodingError("mssa with kappa scales by the number of tokens N, which grows while decoding")
        cache = cache or Growing()
        w = self.heads_of(self.norm(x))  # (B, K, s, p)
        past = cache.extend(w)  # (B, K, t, p), the new tokens included
        h = causal_attention(w, past, past).transpose(1, 2).flatten(2)
        return self.combine(x, self.project(h)), cache

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Back to tokens: the learned output, or (tied) ``eta * h U^T`` in row notation."""
        if self.out is None:
            return self.step_size * (h @ linear_layout(self.subspaces.weight))
        return self.out(h)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        branch = self.project(self.attend(self.norm(x)))
        if self.kappa is None:
            return x, branch
        c = self.kappa * self.head_dim / (x.shape[1] * self.rate_eps**2)  # kappa p / (N eps^2), eq. 10
        return (1 - c) * x, c * branch
