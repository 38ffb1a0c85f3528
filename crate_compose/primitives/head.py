"""Task heads on top of the token representation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .parts import layernorm, linear

if TYPE_CHECKING:
    from torch import nn


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
    footprint=lambda args, shape, context: _footprint(args, shape),
)
def classify(args: ClassifyArgs, shape: Shape) -> nn.Module:
    from ..modules.head import Classify

    return Classify(shape[-1], args.classes, pool=args.pool, norm=args.norm, eps=args.eps)


def _footprint(args: ClassifyArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(classes,)`` logits: ``LN(d)`` and ``Linear(d, classes)``."""
    dim = token_dim(shape, "classify")
    return Footprint((args.classes,), {**layernorm("norm", dim, present=args.norm),
                                       **linear("classifier", dim, args.classes)})
