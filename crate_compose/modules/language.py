"""The modules of :mod:`crate_compose.primitives.language`: token embedding and language-model head.

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
from torch import nn


class TokenEmbedding(nn.Module):
    """``(B, n)`` token ids -> ``(B, n, d)`` rows of ``E`` (GPT-2: init N(0, 0.02^2))."""

    tokenwise = True  # each output token depends on its own id only (cached decoding)

    def __init__(self, vocab: int, dim: int, *, std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # E, the name GPT-2 and nn.Embedding use
        nn.init.normal_(self.weight, std=std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.is_floating_point():
            raise ValueError("token_embed takes integer token ids (set input.dtype: int64)")
        return nn.functional.embedding(ids, self.weight)


class LMHead(nn.Module):
    """``(B, n, d)`` -> ``(B, n, V)`` logits ``z W^T`` (+ b), one distribution per position."""

    tokenwise = True

    def __init__(self, dim: int, vocab: int, *, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # W; tied to E in GPT-2 and causal CRATE
        nn.init.normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(vocab)) if bias else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(z, self.weight, self.bias)
