"""The modules of :mod:`crate_compose.primitives.head`: the classification head.

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
from torch import nn

from .precision import LayerNorm


class Classify(nn.Module):
    """Pool the tokens (class token or mean), then ``LN -> Linear(d, classes)`` (003 Alg. 1)."""

    def __init__(self, dim: int, classes: int, *, pool: str = "cls", norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.pool = pool
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.classifier = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x[:, 0] if self.pool == "cls" else x.mean(dim=1)  # (B, d)
        return self.classifier(self.norm(z))
