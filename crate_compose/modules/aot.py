"""The modules of :mod:`crate_compose.primitives.aot`: the attention-only transformer step (book eq. 5.3.2).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .causal import softmax_attention
from .precision import LayerNorm, float32, linear_layout, softmax
from .residual import Residual


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

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values ``(B, K, n, p)`` of ``x`` (normalized here) and the map back to tokens ``(K*p, d)``."""
        u = self.norm(x)  # (B, n, d)
        if self.variant == "mssa":
            w = self.subspaces(u).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (B, K, n, p)
            return w, w, w, self.subspaces.weight  # (K*p, d): h @ U^T in rows
        qkv = self.qkv(u).unflatten(-1, (3, self.heads, self.head_dim))  # (B, n, 3, K, p)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, K, n, p)
        return q, k, v, self.out.weight.t()  # (K*p, d)

    def _attention(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q, k = float32(q).contiguous(), float32(k).contiguous()  # a batch of matrices each: k^T a transposed view
        scores = self.scale * (q @ k.transpose(-1, -2))  # (B, K, n, n), float32 for half builds
        return self.weights(scores)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """``phi(scale * q_k k_k^T)`` per head, ``(B, K, n, n)``, at the step's input ``x``: the weights
        :meth:`split` applies (rows sum to 1 for ``phi = softmax``; thresholded rows need not)."""
        q, k, _, _ = self._project(x)
        return self._attention(q, k)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, back = self._project(x)
        # Without its LayerNorm the step's logits are unbounded, and CUDA's fused float32 kernel recomputes
        # exp(S - logsumexp) in its backward from S rounded anew: with inputs of 1e6 its gradients overflowed
        # where the formula's did not (measured on an H200; 1e4 was finite). There the formula is applied.
        fused = self.phi == "softmax" and not (isinstance(self.norm, nn.Identity) and q.device.type == "cuda")
        if fused:  # exactly softmax attention: the fused kernel (attention() writes it out)
            h = softmax_attention(q, k, v, scale=self.scale)  # (B, K, n, p)
        else:
            h = self._attention(q, k).to(v.dtype) @ linear_layout(v)  # (B, K, n, p)
        return x, self.step_size * (h.transpose(1, 2).flatten(2) @ linear_layout(back))  # (B, n, d)
