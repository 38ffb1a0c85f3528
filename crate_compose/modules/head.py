"""The modules of :mod:`crate_compose.primitives.head`: the classification head, DINO's and SimDINO's projection
heads.

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .precision import LayerNorm, float32


class Pooled(nn.Module):
    """A head that reads one vector per sample: the class token (the first) or the mean token, then
    ``LN`` (``norm``; the identity without)."""

    def __init__(self, dim: int, *, pool: str = "cls", norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.pool = pool
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(B, n, d)`` to ``(B, d)``."""
        z = x[:, 0] if self.pool == "cls" else x.mean(dim=1)
        return self.norm(z)


class Classify(Pooled):
    """Pool the tokens (class token or mean), then ``LN -> Linear(d, classes)`` (003 Alg. 1)."""

    def __init__(self, dim: int, classes: int, *, pool: str = "cls", norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__(dim, pool=pool, norm=norm, eps=eps)
        self.classifier = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooled(x))


class WeightNormLinear(nn.Module):
    """``Linear(inputs, outputs, bias=False)`` whose weight is ``g ⊙ V / ‖V‖_row`` (Salimans and Kingma
    2016; the norm of each output row), with DINO's parameter names ``weight_g`` ``(outputs, 1)`` and
    ``weight_v`` ``(outputs, inputs)``. ``V`` starts as ``nn.Linear``'s weight does, ``g`` at 1; with
    ``freeze_g`` it stays there (every output a cosine similarity)."""

    def __init__(self, inputs: int, outputs: int, *, freeze_g: bool = True) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(outputs, 1), requires_grad=not freeze_g)
        self.weight_v = nn.Parameter(torch.empty(outputs, inputs))
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))  # nn.Linear's own initialization

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = float32(self.weight_v)  # the row norms in float32 for a half build
        weight = float32(self.weight_g) * v / v.norm(dim=1, keepdim=True)
        return F.linear(x, weight.to(x.dtype))


class SimDinoHead(Pooled):
    """SimDINO's projection head (Wu et al. 2025, Sec. 3; ``vision_transformer.py``'s ``DINOHead`` with its
    last layer removed): pool the tokens (class token or mean) and ``LN`` to ``p``, then ``z = h / ‖h‖₂`` with
    ``h = MLP(p)`` (``layers`` Linear layers, GELU between them, optionally BatchNorm1d after each hidden one):
    the unit feature whose views task simdino aligns and whose coding rate it expands. Parameter names follow the authors' checkpoints
    (``mlp.0.weight``, ...)."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        *,
        hidden: int = 2048,
        layers: int = 3,
        batch_norm: bool = False,
        pool: str = "cls",
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(dim, pool=pool, norm=norm, eps=eps)
        if layers == 1:
            self.mlp: nn.Module = nn.Linear(dim, out_dim)
        else:
            steps: list[nn.Module] = []
            for width in [dim] + [hidden] * (layers - 2):
                steps.append(nn.Linear(width, hidden))
                if batch_norm:
                    steps.append(nn.BatchNorm1d(hidden))
                steps.append(nn.GELU())
            steps.append(nn.Linear(hidden, out_dim))
            self.mlp = nn.Sequential(*steps)
        for module in self.mlp.modules():  # DINO's _init_weights: the MLP's Linear layers only
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalized ``h / ‖h‖₂`` ``(B, out)`` of tokens ``(B, n, d)`` (in float32 for a half build's
        norm, returned in the tokens' dtype)."""
        h = self.mlp(self.pooled(x))
        return F.normalize(float32(h), dim=-1, p=2).to(h.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bottleneck(x)


class DinoHead(SimDinoHead):
    """DINO's projection head (Caron et al. 2021, Sec. 3.1, ``DINOHead``): SimDINO's head to a bottleneck
    ``ĥ = h / ‖h‖₂`` (:class:`SimDinoHead`), then ``(g ⊙ V/‖V‖_row) ĥ``: K = ``out_dim`` prototype scores.
    Parameter names follow DINO's checkpoints (``mlp.0.weight``, ..., ``last_layer.weight_g``,
    ``last_layer.weight_v``)."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        *,
        hidden: int = 2048,
        bottleneck: int = 256,
        layers: int = 3,
        norm_last_layer: bool = True,
        batch_norm: bool = False,
        pool: str = "cls",
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(
            dim, bottleneck, hidden=hidden, layers=layers, batch_norm=batch_norm, pool=pool, norm=norm, eps=eps
        )
        self.last_layer = WeightNormLinear(bottleneck, out_dim, freeze_g=norm_last_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(self.bottleneck(x))
