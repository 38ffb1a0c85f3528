"""Pre-processing: images to tokens (003 App. B.1, Algorithm 1).

``patch_embed``: split into ``P x P`` patches flattened in ``(p1 p2 c)`` order, then
``LN(P*P*C) -> Linear(P*P*C, d) -> LN(d)`` (CRATE), or a strided ``Conv2d(C, d, P, stride P)``
with bias and no LayerNorms (``projection: conv``: CRATE-MAE's and CRATE-alpha's code, ViT).
It records the patch grid ``(H/P, W/P)`` in the build context. ``class_token`` prepends a learned
token. ``positions`` adds a position embedding: learned (CRATE, init randn) or the frozen 2-D
sine-cosine table of MAE / CRATE-MAE, laid out on the grid the patch embedding produced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Context, Example, Footprint, Inverse, Shape, primitive, token_dim
from .parts import conv2d, layernorm, linear

if TYPE_CHECKING:
    from torch import nn


class PatchEmbedArgs(Args):
    patch_size: int = Field(ge=1, description="Side P of the square patches.")
    dim: int = Field(ge=1, description="Token dimension d.")
    norm: bool = Field(
        default=True, description="LayerNorm before and after a linear projection (CRATE: yes; not with conv)."
    )
    projection: Literal["linear", "conv"] = Field(
        default="linear",
        description="'linear': Linear on (p1 p2 c)-flattened patches (CRATE); 'conv': a strided Conv2d with bias, "
        "as the CRATE-MAE and CRATE-alpha code and ViT (same parameter count, (c p1 p2) weight layout).",
    )


# The inverse of any patch embedding: predict each patch's pixels. The authors' CRATE-MAE decoder ends
# with LN(eps 1e-6) -> Linear; paper 001's Listing 3 form keeps LayerNorm's default 1e-5.
TO_PIXELS = Inverse(
    "pixel_head",
    lambda args, shape: {"patch_size": args.patch_size, "eps": 1e-6},
    forms={"listing3": Inverse("pixel_head", lambda args, shape: {"patch_size": args.patch_size})},
)


def in_order(context: Context, name: str) -> None:
    """Refuse a position embedding after a drop-mode mask: the tokens are no longer in grid order."""
    if context.shuffled:
        raise ValueError(
            f"{name} after a mask in drop mode would number the visible tokens as if they were the whole "
            "image; add positions before the mask"
        )


def _patch_update(args: PatchEmbedArgs) -> str:
    if args.projection == "conv":
        return "Conv_P(X) → tokens"
    return "LN(W · LN(patches) + b)" if args.norm else "W · patches + b"


@primitive(
    "patch_embed",
    args=PatchEmbedArgs,
    kind="preprocess",
    objective="none (fixed lifting of pixels to tokens)",
    equation="003 App. B.1, Alg. 1",
    update=_patch_update,
    description="Split images into P x P patches and embed them: LN -> Linear -> LN, or a strided Conv2d.",
    inverse=TO_PIXELS,
    example=Example({"patch_size": 8, "dim": 32}, (3, 32, 32)),
    footprint=lambda args, shape, context: _patch_footprint(args, shape, context),
)
def patch_embed(args: PatchEmbedArgs, shape: Shape) -> nn.Module:
    from ..modules.embed import ConvPatchEmbed, PatchEmbed

    if args.projection == "conv":
        return ConvPatchEmbed(shape[0], args.patch_size, args.dim)
    return PatchEmbed(shape[0], args.patch_size, args.dim, norm=args.norm)


def _patch_footprint(args: PatchEmbedArgs, shape: Shape, context: Context) -> Footprint:
    """Images ``(C, H, W)`` to ``(H/P * W/P, d)`` tokens; sets the patch grid of the build."""
    c, h, w = image_shape(shape, "patch_embed")
    if context.image is None:  # the network's input is not an image: int64 token ids
        raise ValueError("patch_embed takes float images; this network's input is int64 token ids (use token_embed)")
    if h % args.patch_size or w % args.patch_size:
        raise ValueError(f"image size {h}x{w} is not divisible by patch_size={args.patch_size}")
    context.grid = (h // args.patch_size, w // args.patch_size)
    tokens, flat = context.grid[0] * context.grid[1], c * args.patch_size**2
    if args.projection == "conv":
        if args.norm:
            raise ValueError("projection 'conv' has no LayerNorms (as the authors' code): set norm: false")
        return Footprint((tokens, args.dim), conv2d("project", c, args.dim, args.patch_size))
    parameters = {
        **layernorm("norm_in", flat, present=args.norm),
        **linear("project", flat, args.dim),
        **layernorm("norm_out", args.dim, present=args.norm),
    }
    return Footprint((tokens, args.dim), parameters)


def image_shape(shape: Shape, name: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of an image input; a clear error for anything else."""
    if len(shape) != 3:
        raise ValueError(f"{name} takes images of shape (C, H, W); got input of shape {shape}")
    return shape  # type: ignore[return-value]


class ClassTokenArgs(Args):
    init: Literal["randn", "trunc_normal"] = Field(
        default="randn", description="'randn': N(0, 1) (CRATE); 'trunc_normal': truncated normal, std 0.02 (ToST)."
    )


@primitive(
    "class_token",
    args=ClassTokenArgs,
    kind="preprocess",
    objective="none (summary token for classification)",
    equation="003 App. B.1, Alg. 1",
    update="[z_cls, Z]",
    description="Prepend a learned class token.",
    inverse=Inverse("drop_tokens", lambda args, shape: {"count": 1}),
    example=Example({}, (16, 32)),
    footprint=lambda args, shape, context: _class_token_footprint(shape),
)
def class_token(args: ClassTokenArgs, shape: Shape) -> nn.Module:
    from ..modules.embed import ClassToken

    return ClassToken(shape[-1], init=args.init)


def _class_token_footprint(shape: Shape) -> Footprint:
    n, d = shape[0], token_dim(shape, "class_token")
    return Footprint((n + 1, d), {"token": (1, 1, d)})


class PositionsArgs(Args):
    init: Literal["randn", "normal", "sincos2d"] = Field(
        default="randn",
        description="'randn': learned, initialized N(0, 1) (CRATE); 'normal': N(0, 0.02^2) (GPT-2); "
        "'sincos2d': the 2-D sine-cosine table (MAE).",
    )
    trainable: bool = Field(
        default=True, description="Learn the embedding; false freezes it (counted in params_total, not trainable)."
    )
    grid: tuple[int, int] | None = Field(
        default=None,
        description="Patch grid (h, w) for 'sincos2d'; default the grid of the patch embedding before it. "
        "Tokens before the grid (a class token) get a zero embedding.",
    )
    interpolate: bool = Field(
        default=False,
        description="Take square images of any size (DINO's local crops, evaluation at another resolution): the "
        "table's patch-grid rows are resized bicubically to the input's grid, as DINO's interpolate_pos_encoding; "
        "tokens before the grid (a class token) keep theirs. Needs a patch grid before it.",
    )


def _grid(args: PositionsArgs, tokens: int, context: Context) -> tuple[int, int]:
    grid = args.grid or context.grid
    if grid is None:
        what = "'sincos2d' positions" if args.init == "sincos2d" else "interpolated positions"
        raise ValueError(f"{what} need a patch grid: put them after a patch embedding, or give grid")
    if grid[0] * grid[1] > tokens:
        raise ValueError(f"grid {tuple(grid)} has more cells than the {tokens} tokens")
    return tuple(grid)  # type: ignore[return-value]


@primitive(
    "positions",
    args=PositionsArgs,
    kind="preprocess",
    objective="none (token positions)",
    equation="003 App. B.1, Alg. 1; 001 Sec. 3",
    update="Z + E_pos",
    description="Add a position embedding: learned (randn) or the frozen 2-D sine-cosine table.",
    # The authors' CRATE-MAE code adds positions once, at the encoder input; MAE (and the listing3
    # form) adds them again where the decoder starts.
    inverse=Inverse(
        None,
        where="prologue",
        forms={"listing3": Inverse("positions", lambda args, shape: args.model_dump(), where="prologue")},
    ),
    example=Example({"init": "randn"}, (17, 32)),
    footprint=lambda args, shape, context: _positions_footprint(args, shape, context),
)
def positions(args: PositionsArgs, shape: Shape, context: Context) -> nn.Module:
    from ..modules.embed import Positions, position_table

    grid = _grid(args, shape[0], context) if args.init == "sincos2d" or args.interpolate else None
    return Positions(
        *shape,
        table=position_table(args.init, *shape, grid=grid),
        trainable=args.trainable,
        grid=grid if args.interpolate else None,
    )


def _positions_footprint(args: PositionsArgs, shape: Shape, context: Context) -> Footprint:
    """Tokens ``(n, d)`` in, the same out; the table ``(1, n, d)`` is a parameter (frozen or not)."""
    dim = token_dim(shape, "positions")
    in_order(context, "positions")
    if args.init == "sincos2d" or args.interpolate:
        _grid(args, shape[0], context)
    if args.init == "sincos2d":
        if dim % 4:
            raise ValueError(f"sine-cosine positions need d divisible by 4; got d={dim}")
    return Footprint(shape, {"embedding": (1, *shape)}, frozen=frozenset() if args.trainable else {"embedding"})


class PixelHeadArgs(Args):
    patch_size: int = Field(ge=1, description="Side P of the patches to predict.")
    channels: int | None = Field(default=None, ge=1, description="Image channels C; default the input image's.")
    norm: bool = Field(default=True, description="LayerNorm before the prediction (CRATE-MAE: yes).")
    eps: float = Field(default=1e-5, gt=0, description="LayerNorm epsilon (the authors' CRATE-MAE code: 1e-6).")


@primitive(
    "pixel_head",
    args=PixelHeadArgs,
    kind="head",
    objective="masked reconstruction ||patches - prediction||^2 on hidden patches",
    equation="001 Sec. 3, App. B.1",
    update="W · LN Z + b → pixels",
    description="Inverse of patch_embed: predict the P x P x C pixels of every token ((p1 p2 c) order).",
    example=Example({"patch_size": 8, "channels": 3}, (16, 32)),
    footprint=lambda args, shape, context: _pixel_footprint(args, shape, context),
)
def pixel_head(args: PixelHeadArgs, shape: Shape, context: Context) -> nn.Module:
    from ..modules.embed import PixelHead

    return PixelHead(shape[-1], args.patch_size, _channels(args, context), norm=args.norm, eps=args.eps)


def _channels(args: PixelHeadArgs, context: Context) -> int:
    channels = args.channels or (context.image[0] if context.image else None)
    if channels is None:
        raise ValueError("pixel_head needs channels: the input is not an image, so give channels")
    return channels


def _pixel_footprint(args: PixelHeadArgs, shape: Shape, context: Context) -> Footprint:
    """Tokens ``(n, d)`` to ``(n, P*P*C)`` pixels: ``LN(d)`` and ``Linear(d, P*P*C)``."""
    n, d = shape[0], token_dim(shape, "pixel_head")
    pixels = args.patch_size**2 * _channels(args, context)
    return Footprint((n, pixels), {**layernorm("norm", d, present=args.norm), **linear("predict", d, pixels)})


class DropTokensArgs(Args):
    count: int = Field(default=1, ge=1, description="How many leading tokens to drop.")


@primitive(
    "drop_tokens",
    args=DropTokensArgs,
    kind="preprocess",
    objective="none",
    equation="001 Sec. 3",
    update="Z[:, k:]",
    description="Inverse of class_token: drop leading tokens so only image tokens remain.",
    example=Example({"count": 1}, (17, 32)),
    footprint=lambda args, shape, context: _drop_footprint(args, shape),
)
def drop_tokens(args: DropTokensArgs, shape: Shape) -> nn.Module:
    from ..modules.embed import DropTokens

    return DropTokens(args.count)


def _drop_footprint(args: DropTokensArgs, shape: Shape) -> Footprint:
    d = token_dim(shape, "drop_tokens")  # tokens (n, d) only
    if shape[0] <= args.count:
        raise ValueError(f"cannot drop {args.count} tokens from {shape[0]}")
    return Footprint((shape[0] - args.count, d))
