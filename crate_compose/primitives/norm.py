"""Normalization as a step of its own (most steps carry their own LayerNorm)."""

from __future__ import annotations

from pydantic import Field
from torch import nn

from ..registry import Args, Inverse, Shape, primitive


class LayerNormArgs(Args):
    eps: float = Field(default=1e-5, gt=0, description="Added to the variance for stability.")


@primitive(
    "layernorm",
    args=LayerNormArgs,
    kind="norm",
    objective="none (projects each token onto a sphere, up to an affine map)",
    equation="Ba et al. 2016",
    update="LN Z",
    description="LayerNorm over the feature axis, with affine weights.",
    inverse=Inverse("layernorm", lambda args, shape: args.model_dump()),
)
def layernorm(args: LayerNormArgs, shape: Shape) -> nn.Module:
    return nn.LayerNorm(shape[-1], eps=args.eps)
