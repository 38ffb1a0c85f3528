"""Pre-processing: images to tokens (003 App. B.1, Algorithm 1).

``patch_embed``: split into ``P x P`` patches flattened in ``(p1 p2 c)`` order, then
``LN(P*P*C) -> Linear(P*P*C, d) -> LN(d)`` (CRATE), or a strided ``Conv2d(C, d, P, stride P)``
with bias and no LayerNorms (``projection: conv``: CRATE-MAE's and CRATE-alpha's code, ViT).
It records the patch grid ``(H/P, W/P)`` in the build context. ``class_token`` prepends a learned
token. ``positions`` adds a position embedding: learned (CRATE, init randn) or the frozen 2-D
sine-cosine table of MAE / CRATE-MAE, laid out on the grid the patch embedding produced.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..registry import Args, Context, Example, Inverse, Shape, primitive, token_dim
from .precision import LayerNorm


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """``(B, C, H, W) -> (B, (H/P)(W/P), P*P*C)``, pixels in ``(p1 p2 c)`` order (einops
    ``'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'``)."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


class PatchEmbed(nn.Module):
    """``LN -> Linear -> LN`` on flattened patches (003 Algorithm 1, ``to_patch_embedding``)."""

    def __init__(self, channels: int, patch_size: int, dim: int, *, norm: bool = True) -> None:
        super().__init__()
        self.patch_size = patch_size
        patch_dim = channels * patch_size * patch_size
        self.norm_in = LayerNorm(patch_dim) if norm else nn.Identity()
        self.project = nn.Linear(patch_dim, dim)
        self.norm_out = LayerNorm(dim) if norm else nn.Identity()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.norm_out(self.project(self.norm_in(patchify(images, self.patch_size))))


class ConvPatchEmbed(nn.Module):
    """``Conv2d(C, d, P, stride P)`` then flatten the grid row by row: ``(B, C, H, W) -> (B, hw, d)``."""

    def __init__(self, channels: int, patch_size: int, dim: int) -> None:
        super().__init__()
        self.project = nn.Conv2d(channels, dim, patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.project(images).flatten(2).transpose(1, 2)  # (B, d, h, w) -> (B, hw, d)


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
)
def patch_embed(args: PatchEmbedArgs, shape: Shape, context: Context) -> nn.Module:
    c, h, w = image_shape(shape, "patch_embed")
    if context.image is None:  # the network's input is not an image: int64 token ids
        raise ValueError("patch_embed takes float images; this network's input is int64 token ids (use token_embed)")
    if h % args.patch_size or w % args.patch_size:
        raise ValueError(f"image size {h}x{w} is not divisible by patch_size={args.patch_size}")
    context.grid = (h // args.patch_size, w // args.patch_size)
    if args.projection == "conv":
        if args.norm:
            raise ValueError("projection 'conv' has no LayerNorms (as the authors' code): set norm: false")
        return ConvPatchEmbed(c, args.patch_size, args.dim)
    return PatchEmbed(c, args.patch_size, args.dim, norm=args.norm)


def image_shape(shape: Shape, name: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of an image input; a clear error for anything else."""
    if len(shape) != 3:
        raise ValueError(f"{name} takes images of shape (C, H, W); got input of shape {shape}")
    return shape  # type: ignore[return-value]


class ClassToken(nn.Module):
    """Prepend a learned class token (init randn, 003 Alg. 1): ``(B, n, d) -> (B, n+1, d)``."""

    def __init__(self, dim: int, *, init: str = "randn") -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, dim))
        if init == "trunc_normal":  # ToST / XCiT: truncated normal, std 0.02
            nn.init.trunc_normal_(self.token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


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
)
def class_token(args: ClassTokenArgs, shape: Shape) -> nn.Module:
    return ClassToken(token_dim(shape, "class_token"), init=args.init)


def sincos_2d(dim: int, grid: tuple[int, int], leading: int = 0) -> torch.Tensor:
    """The fixed 2-D sine-cosine table of MAE: ``(leading + h*w, dim)``; leading rows are zero.

    Half of the features encode the row, half the column; each half is ``[sin(pos w), cos(pos w)]``
    with frequencies ``w_i = 10000^(-i / (dim/4))``.
    """
    if dim % 4:
        raise ValueError(f"sine-cosine positions need d divisible by 4; got d={dim}")
    h, w = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    # MAE's convention: the first half encodes the width coordinate, the second the height.
    table = torch.cat([encode(cols), encode(rows)], dim=1)
    return torch.cat([torch.zeros(leading, dim, dtype=torch.float64), table]).float()


class Positions(nn.Module):
    """Add a position embedding of shape ``(1, N, d)`` (003 Alg. 1; 001 Sec. 3); a sequence of
    ``n <= N`` tokens gets its first ``n`` rows (a language model's shorter contexts)."""

    def __init__(self, tokens: int, dim: int, *, table: torch.Tensor | None = None, trainable: bool = True) -> None:
        super().__init__()
        init = torch.randn(1, tokens, dim) if table is None else table.reshape(1, tokens, dim).clone()
        self.embedding = nn.Parameter(init, requires_grad=trainable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(x, 0)[0]

    def decode(self, x: torch.Tensor, offset: int | None) -> tuple[torch.Tensor, int]:
        """Positions ``offset .. offset + n - 1`` for ``n`` new tokens; the state is the tokens seen."""
        offset = offset or 0
        end = offset + x.shape[1]
        if end > self.embedding.shape[1]:
            raise ValueError(f"{end} tokens, but the position table holds {self.embedding.shape[1]} (the context size)")
        return x + self.embedding[:, offset:end], end


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


def _grid(args: PositionsArgs, tokens: int, context: Context) -> tuple[int, int]:
    grid = args.grid or context.grid
    if grid is None:
        raise ValueError("'sincos2d' positions need a patch grid: put them after a patch embedding, or give grid")
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
)
def positions(args: PositionsArgs, shape: Shape, context: Context) -> nn.Module:
    dim = token_dim(shape, "positions")
    in_order(context, "positions")
    tokens = shape[0]
    table = None
    if args.init == "normal":
        table = torch.randn(tokens, dim) * 0.02
    elif args.init == "sincos2d":
        grid = _grid(args, tokens, context)
        table = sincos_2d(dim, grid, leading=tokens - grid[0] * grid[1])
    return Positions(tokens, dim, table=table, trainable=args.trainable)


class PixelHead(nn.Module):
    """``LN -> Linear(d, P*P*C)``: predict each token's patch of pixels, ``(p1 p2 c)`` order (001 Sec. 3)."""

    def __init__(self, dim: int, patch_size: int, channels: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.predict = nn.Linear(dim, patch_size * patch_size * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predict(self.norm(x))


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
)
def pixel_head(args: PixelHeadArgs, shape: Shape, context: Context) -> nn.Module:
    channels = args.channels or (context.image[0] if context.image else None)
    if channels is None:
        raise ValueError("pixel_head needs channels: the input is not an image, so give channels")
    return PixelHead(token_dim(shape, "pixel_head"), args.patch_size, channels, norm=args.norm, eps=args.eps)


class DropTokens(nn.Module):
    """Drop the first ``count`` tokens (the class token): ``(B, n, d) -> (B, n - count, d)``."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.count :]


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
)
def drop_tokens(args: DropTokensArgs, shape: Shape) -> nn.Module:
    token_dim(shape, "drop_tokens")  # tokens (n, d) only
    if shape[0] <= args.count:
        raise ValueError(f"cannot drop {args.count} tokens from {shape[0]}")
    return DropTokens(args.count)
