"""Normalization as a step of its own (most steps carry their own LayerNorm): a stack's final
``LN`` (CRATE-MAE's and ToST's encoders end with one, eps 1e-6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..registry import Args, Example, Footprint, Inverse, Shape, primitive
from .parts import layernorm as layernorm_part

if TYPE_CHECKING:
    from torch import nn


class LayerNormArgs(Args):
    eps: float = Field(default=1e-5, gt=0, description="Added to the variance for stability.")
    bias: bool = Field(
        default=True,
        description="A learned shift besides the scale (nanoGPT's `bias`: false in the ToST language models).",
    )


@primitive(
    "layernorm",
    args=LayerNormArgs,
    kind="norm",
    objective="none (projects each token onto a sphere, up to an affine map)",
    equation="Ba et al. 2016",
    update="LN Z",
    description="LayerNorm over the feature axis, with affine weights.",
    # Not invertible (it forgets each token's mean and scale). A derived decoder leaves it out, as the
    # authors' CRATE-MAE code does with its encoder's final LayerNorm: the decoder steps normalize anyway.
    inverse=Inverse(None),
    example=Example({"eps": 1e-6}, (16, 32)),
    footprint=lambda args, shape, context: Footprint(shape, layernorm_part("", shape[-1], bias=args.bias)),
)
def layernorm(args: LayerNormArgs, shape: Shape) -> nn.Module:
    from ..modules.precision import LayerNorm

    return LayerNorm(shape[-1], eps=args.eps, bias=args.bias)
