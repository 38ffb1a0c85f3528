"""The modules of :mod:`crate_compose.primitives.diffuse`: the decoder's inverse steps (001 Sec. 2.4-2.5, Listing 3).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .compress import MSSA
from .precision import LayerNorm


class MSSAAscent(MSSA):
    """``y - MSSA(LN_b y | V)``: a gradient *ascent* step on R^c (001 eq. 2.16); with
    ``residual='normalized'``, ``LN_b y - MSSA(LN_b y | V)`` (Listing 3)."""

    def __init__(self, *args, residual: str = "input", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.residual = residual

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)
        skip = y if self.residual == "normalized" else x
        return skip, -self.project(self.attend(y))


class Dictionary(nn.Module):
    """``LN_a(x) E^T``: synthesize tokens from sparse codes with a learned dictionary E (001 Listing 3)."""

    def __init__(self, dim: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, dim))  # E, as nn.Linear(d, d, bias=False)
        nn.init.kaiming_uniform_(self.dictionary, a=5**0.5)  # nn.Linear's default init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.dictionary)
