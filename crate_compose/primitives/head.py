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
    update=lambda args: (
        "W · "
        + (
            f"LN({args.pool == 'cls' and 'z_cls' or 'mean Z'})"
            if args.norm
            else ("z_cls" if args.pool == "cls" else "mean Z")
        )
        + " + b"
    ),
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
    return Footprint(
        (args.classes,), {**layernorm("norm", dim, present=args.norm), **linear("classifier", dim, args.classes)}
    )


class SimDinoHeadArgs(Args):
    out_dim: int = Field(
        default=256,
        ge=1,
        description="Size p of the L2-normalized output, the feature whose coding "
        "rate task simdino expands (SimDINO's --z_dim: 256).",
    )
    hidden: int = Field(default=2048, ge=1, description="Width of the MLP's hidden layers (SimDINO: 2048).")
    layers: int = Field(
        default=3,
        ge=1,
        description="Linear layers of the MLP, GELU between them (SimDINO: 3; 1: a single Linear(d, out_dim)).",
    )
    batch_norm: bool = Field(
        default=False, description="BatchNorm1d after each hidden Linear (SimDINO's use_bn: false)."
    )
    pool: Literal["cls", "mean"] = Field(default="cls", description="Read the class token or the mean token.")
    norm: bool = Field(
        default=True,
        description="LayerNorm on the pooled token, as classify's (CRATE has no final "
        "norm in its encoder; the ViT: its final norm).",
    )
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (the authors' ViT: 1e-6).")


def _pooled(args) -> str:
    """The pooled, normalized token a projection head reads, in words."""
    z = "z_cls" if args.pool == "cls" else "mean Z"
    return f"MLP(LN({z}))" if args.norm else f"MLP({z})"


@primitive(
    "simdino_head",
    args=SimDinoHeadArgs,
    kind="head",
    objective="SimDINO's coding-rate regularized self-distillation: the views' cosine similarity plus the rate "
    "R_eps of the features (trained, not unrolled)",
    equation="Wu et al. 2025 (SimDINO) Sec. 3, DINOHead without its last layer",
    update=lambda args: f"h/‖h‖₂,  h = {_pooled(args)}",
    description="SimDINO's projection head: pool tokens (class token or mean), LayerNorm, an MLP to p features, "
    "L2-normalize (DINO's head without its prototypes).",
    example=Example({"out_dim": 8, "hidden": 16}, (17, 32)),
    footprint=lambda args, shape, context: _simdino_footprint(args, shape),
)
def simdino_head(args: SimDinoHeadArgs, shape: Shape) -> nn.Module:
    from ..modules.head import SimDinoHead

    return SimDinoHead(
        shape[-1],
        args.out_dim,
        hidden=args.hidden,
        layers=args.layers,
        batch_norm=args.batch_norm,
        pool=args.pool,
        norm=args.norm,
        eps=args.eps,
    )


def _projection(dim: int, hidden: int, out: int, layers: int, batch_norm: bool) -> dict[str, Shape]:
    """The MLP of DINO's and SimDINO's heads as their ``nn.Sequential`` numbers it (``mlp.0`` Linear,
    [``mlp.1`` BatchNorm1d], GELU, ...; one layer: ``mlp`` itself)."""
    if layers == 1:
        return linear("mlp", dim, out)
    mlp, index, width = {}, 0, dim
    for _ in range(layers - 1):  # Linear [BatchNorm1d] GELU
        mlp.update(linear(f"mlp.{index}", width, hidden))
        if batch_norm:
            mlp.update(batchnorm(f"mlp.{index + 1}", hidden))
        index, width = index + (3 if batch_norm else 2), hidden
    mlp.update(linear(f"mlp.{index}", hidden, out))
    return mlp


def _simdino_footprint(args: SimDinoHeadArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(out_dim,)``: ``LN(d)`` and the MLP (:func:`_projection`)."""
    dim = token_dim(shape, "simdino_head")
    return Footprint(
        (args.out_dim,),
        {
            **layernorm("norm", dim, present=args.norm),
            **_projection(dim, args.hidden, args.out_dim, args.layers, args.batch_norm),
        },
    )


class DinoHeadArgs(Args):
    out_dim: int = Field(default=65536, ge=1, description="Number K of prototypes: the output's size (DINO: 65536).")
    hidden: int = Field(default=2048, ge=1, description="Width of the MLP's hidden layers (DINO: 2048).")
    bottleneck: int = Field(default=256, ge=1, description="Size of the L2-normalized bottleneck (DINO: 256).")
    layers: int = Field(
        default=3,
        ge=1,
        description="Linear layers of the MLP, GELU between them (DINO: 3; 1: a single Linear(d, bottleneck)).",
    )
    norm_last_layer: bool = Field(
        default=True,
        description="Freeze the weight-normalized last layer's scale g at 1, "
        "so each prototype is a unit vector (DINO: true).",
    )
    batch_norm: bool = Field(default=False, description="BatchNorm1d after each hidden Linear (DINO's use_bn: false).")
    pool: Literal["cls", "mean"] = Field(default="cls", description="Read the class token or the mean token.")
    norm: bool = Field(
        default=True,
        description="LayerNorm on the pooled token, as classify's (CRATE has no final "
        "norm in its encoder; DINO's ViT: its final norm).",
    )
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (DINO's ViT: 1e-6).")


def _dino_update(args: DinoHeadArgs) -> str:
    return f"(g ⊙ V/‖V‖_row) · h/‖h‖₂,  h = {_pooled(args)}"


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

    return DinoHead(
        shape[-1],
        args.out_dim,
        hidden=args.hidden,
        bottleneck=args.bottleneck,
        layers=args.layers,
        norm_last_layer=args.norm_last_layer,
        batch_norm=args.batch_norm,
        pool=args.pool,
        norm=args.norm,
        eps=args.eps,
    )


def _dino_footprint(args: DinoHeadArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)`` to ``(out_dim,)``: ``LN(d)``; the MLP (:func:`_projection`); ``last_layer``'s
    ``weight_g`` ``(out_dim, 1)`` (frozen with ``norm_last_layer``) and ``weight_v`` ``(out_dim, bottleneck)``."""
    dim = token_dim(shape, "dino_head")
    mlp = _projection(dim, args.hidden, args.bottleneck, args.layers, args.batch_norm)
    last = {"last_layer.weight_g": (args.out_dim, 1), "last_layer.weight_v": (args.out_dim, args.bottleneck)}
    return Footprint(
        (args.out_dim,),
        {**layernorm("norm", dim, present=args.norm), **mlp, **last},
        frozen={"last_layer.weight_g"} if args.norm_last_layer else frozenset(),
    )
