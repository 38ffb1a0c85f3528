"""Task heads on top of the token representation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Example, Footprint, Shape, primitive, token_dim
from .parts import batchnorm, layernorm, linear

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


class DinoHeadArgs(Args):
    out_dim: int = Field(default=65536, ge=1, description="Number K of prototypes: the output's size (DINO: 65536).")
    hidden: int = Field(default=2048, ge=1, description="Width of the MLP's hidden layers (DINO: 2048).")
    bottleneck: int = Field(default=256, ge=1, description="Size of the L2-normalized bottleneck (DINO: 256).")
    layers: int = Field(default=3, ge=1, description="Linear layers of the MLP, GELU between them (DINO: 3; 1: a "
                                                     "single Linear(d, bottleneck)).")
    norm_last_layer: bool = Field(default=True, description="Freeze the weight-normalized last layer's scale g at 1, "
                                                            "so each prototype is a unit vector (DINO: true).")
    batch_norm: bool = Field(default=False, description="BatchNorm1d after each hidden Linear (DINO's use_bn: false).")
    pool: Literal["cls", "mean"] = Field(default="cls", description="Read the class token or the mean token.")
    norm: bool = Field(default=True, description="LayerNorm on the pooled token, as classify's (CRATE has no final "
                                                 "norm in its encoder; DINO's ViT: its final norm).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (DINO's ViT: 1e-6).")


def _dino_update(args: DinoHeadArgs) -> str:
    z = "z_cls" if args.pool == "cls" else "mean Z"
    h = f"MLP(LN({z}))" if args.norm else f"MLP({z})"
    return f"(g ⊙ V/‖V‖_row) · h/‖h‖₂,  h = {h}"


@primitive(
    "dino_head",
    args=DinoHeadArgs,
    kind="head",
    objective="DINO's self-distillation: cross-entropy between the teacher's and the student's softmax over K "
              "prototypes (trained, not unrolled)",
    equation="Caron et al. 2021 (DINO) Sec. 3.1, DINOHead",
    update=_dino_update,
    description="DINO's projection head: pool tokens (class token or mean), LayerNorm, an MLP to a bottleneck, "
                "L2-normalize, a weight-normalized Linear to K prototypes.",
    example=Example({"out_dim": 32, "hidden": 16, "bottleneck": 8}, (17, 32)),
    footprint=lambda args, shape, context: _dino_footprint(args, shape),
)
def dino_head(args: DinoHeadArgs, shape: Shape) -> nn.Module:
    from ..modules.head import DinoHead

    return DinoHead(shape[-1], args.out_dim, hidden=args.hidden, bottleneck=args.bottleneck, layers=args.layers,
                    norm_last_layer=args.norm_last_layer, batch_norm=args.batch_norm, pool=args.pool,
                    norm=args.norm, eps=args.eps)


def _dino_footprint(args: DinoHeadArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(out_dim,)``: ``LN(d)``; the MLP as DINO's ``nn.Sequential`` numbers it
    (``mlp.0`` Linear, [``mlp.1`` BatchNorm1d], GELU, ...; one layer: ``mlp`` itself); ``last_layer``'s
    ``weight_g`` ``(out_dim, 1)`` (frozen with ``norm_last_layer``) and ``weight_v`` ``(out_dim, bottleneck)``."""
    dim = token_dim(shape, "dino_head")
    if args.layers == 1:
        mlp = linear("mlp", dim, args.bottleneck)
    else:
        mlp, index, width = {}, 0, dim
        for _ in range(args.layers - 1):  # Linear [BatchNorm1d] GELU
            mlp.update(linear(f"mlp.{index}", width, args.hidden))
            if args.batch_norm:
                mlp.update(batchnorm(f"mlp.{index + 1}", args.hidden))
            index, width = index + (3 if args.batch_norm else 2), args.hidden
        mlp.update(linear(f"mlp.{index}", args.hidden, args.bottleneck))
    last = {"last_layer.weight_g": (args.out_dim, 1), "last_layer.weight_v": (args.out_dim, args.bottleneck)}
    return Footprint((args.out_dim,), {**layernorm("norm", dim, present=args.norm), **mlp, **last},
                     frozen={"last_layer.weight_g"} if args.norm_last_layer else frozenset())
