"""Task heads on top of the token representation."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..registry import Args, Example, Shape, primitive, token_dim
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


class ClassifyArgs(Args):
    classes: int = Field(ge=1, description="Number of classes.")
    pool: Literal["cls", "mean"] = Field(default="cls", description="Summarize by the class token or the mean token.")
    norm: bool = Field(default=True, description="LayerNorm before the classifier (CRATE: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (timm's ViT: 1e-6).")


@primitive(
    "classify",
    args=ClassifyArgs,
    kind="head",
    objective="cross-entropy on the pooled token (trained, not unrolled)",
    equation="003 Sec. 3, Alg. 1",
    update=lambda args: "W · " + (f"LN({args.pool == 'cls' and 'z_cls' or 'mean Z'})" if args.norm
                                  else ("z_cls" if args.pool == "cls" else "mean Z")) + " + b",
    description="Classification head: pool tokens (class token or mean), LayerNorm, Linear.",
    example=Example({"classes": 10}, (17, 32)),
)
def classify(args: ClassifyArgs, shape: Shape) -> nn.Module:
    return Classify(token_dim(shape, "classify"), args.classes, pool=args.pool, norm=args.norm, eps=args.eps)
