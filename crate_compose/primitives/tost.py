"""ToST's vision parts (book Table 5.3; XCiT-style network, Ali et al. 2021; CaiT, Touvron et al. 2021).

* ``conv_patch_embed``: XCiT's ``ConvPatchEmbed``: 3x3 stride-2 convolutions without bias, each
  followed by BatchNorm, GELU between them; ``C -> d/8 -> d/4 -> d/2 -> d`` for patch 16
  (``C -> d/4 -> d/2 -> d`` for patch 8). Sets the patch grid of the build.
* ``fourier_positions``: XCiT's ``PositionalEncodingFourier``: sin/cos features of the normalized
  ``(y, x)`` grid, projected by a 1x1 convolution and added to the tokens.
* ``class_attention``: CaiT/XCiT class attention: only the class token queries the (normalized) tokens.
* ``class_mlp``: the second half of XCiT's class-attention block (``tokens_norm=True``): LayerNorm over
  all tokens, an MLP on the class token.

The class-attention block of the authors' code is ``class_attention`` followed by ``class_mlp``, each
with LayerScale (added by the builder). None of these is a step of an optimization algorithm.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..registry import Args, Context, Example, Shape, primitive, token_dim
from ..residual import Residual
from .compress import head_dim_of
from .embed import TO_PIXELS, in_order
from .precision import LayerNorm


# ------------------------------------------------------------------------------- convolutional patch embedding


class ConvPatchEmbed(nn.Module):
    """``(B, C, H, W) -> (B, (H/P)(W/P), d)``: strided 3x3 convolutions (XCiT ``ConvPatchEmbed``)."""

    def __init__(self, channels: int, dim: int, patch_size: int = 16) -> None:
        super().__init__()
        widths = [channels] + [dim // 2**i for i in reversed(range(int(math.log2(patch_size))))]  # C, d/8, .., d
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:])):
            if i:
                layers.append(nn.GELU())  # between the convolutions, not after the last
            layers.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out)))
        self.proj = nn.Sequential(*layers)  # the authors' layout: proj.0.0 conv, proj.0.1 BN, proj.1 GELU, ...

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, d, H/P, W/P) -> (B, n, d), row-major grid


class ConvPatchEmbedArgs(Args):
    dim: int = Field(ge=1, description="Token dimension d (divisible by 8 for patch 16, by 4 for patch 8).")
    patch_size: Literal[8, 16] = Field(
        default=16, description="Side P of the patches: 16 (four stride-2 convolutions) or 8 (three), as XCiT."
    )


@primitive(
    "conv_patch_embed",
    args=ConvPatchEmbedArgs,
    kind="preprocess",
    objective="none (learned lifting of pixels to tokens)",
    equation="XCiT (Ali et al. 2021) ConvPatchEmbed; ToST (002 Table 5.3)",
    update="BN(conv₃ₓ₃/2(… GELU(BN(conv₃ₓ₃/2(X))) …)) → tokens",
    description="Convolutional patch embedding: 3x3 stride-2 convolutions with BatchNorm and GELU (XCiT, ToST).",
    inverse=TO_PIXELS,
    example=Example(args={"dim": 32}, shape=(3, 32, 32)),
)
def conv_patch_embed(args: ConvPatchEmbedArgs, shape: Shape, context: Context) -> nn.Module:
    if len(shape) != 3:
        raise ValueError(f"conv_patch_embed takes images of shape (C, H, W); got input of shape {shape}")
    c, h, w = shape
    p = args.patch_size
    if h % p or w % p:
        raise ValueError(f"conv_patch_embed: image size {h}x{w} is not divisible by patch_size={p}")
    stages = int(math.log2(p)) - 1
    if args.dim % 2**stages:
        raise ValueError(f"conv_patch_embed: dim={args.dim} must be divisible by {2**stages} for patch_size={p}")
    context.grid = (h // p, w // p)
    return ConvPatchEmbed(c, args.dim, p)


# ------------------------------------------------------------------------------- Fourier positions


def fourier_features(grid: tuple[int, int], hidden: int, temperature: float) -> torch.Tensor:
    """XCiT's sin/cos features ``(2*hidden, H, W)`` in float64: first the y (row) half, then the x half.

    Coordinates are ``1..H`` (``1..W``), divided by ``H + 1e-6`` and scaled by ``2 pi``; feature
    ``2i`` is ``sin(pos / T^(2i/hidden))`` and ``2i+1`` is ``cos(pos / T^(2i/hidden))``.
    """
    h, w = grid
    scale, eps = 2 * math.pi, 1e-6
    y = torch.arange(1, h + 1, dtype=torch.float64)[:, None].expand(h, w)  # cumsum of ones over rows
    x = torch.arange(1, w + 1, dtype=torch.float64)[None, :].expand(h, w)
    y, x = y / (h + eps) * scale, x / (w + eps) * scale
    dim_t = temperature ** (2 * (torch.arange(hidden, dtype=torch.float64) // 2) / hidden)  # (hidden,)

    def encode(pos: torch.Tensor) -> torch.Tensor:  # (H, W) -> (hidden, H, W), sin/cos interleaved
        angles = pos[..., None] / dim_t  # (H, W, hidden)
        return torch.stack([angles[..., 0::2].sin(), angles[..., 1::2].cos()], dim=-1).flatten(-2).permute(2, 0, 1)

    return torch.cat([encode(y), encode(x)], dim=0)


class FourierPositions(nn.Module):
    """``x + Conv1x1(fourier(grid))``: XCiT's ``PositionalEncodingFourier``, added to ``(B, H*W, d)`` tokens."""

    def __init__(self, dim: int, grid: tuple[int, int], *, hidden: int = 32, temperature: float = 10000.0) -> None:
        super().__init__()
        self.token_projection = nn.Conv2d(2 * hidden, dim, kernel_size=1)  # the authors' name
        # fixed features, kept in float64 and cast where used (so a float64 model gets exact values)
        self.register_buffer("features", fourier_features(grid, hidden, temperature)[None], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.token_projection.weight
        pos = self.token_projection(self.features.to(weight.dtype))  # (1, d, H, W)
        return x + pos.flatten(2).transpose(1, 2)  # (B, n, d)


class FourierPositionsArgs(Args):
    hidden: int = Field(default=32, ge=2, description="Sin/cos features per axis (XCiT: 32); must be even.")
    temperature: float = Field(default=10000.0, gt=0, description="Frequency base T of the features (XCiT: 10000).")
    grid: tuple[int, int] | None = Field(
        default=None, description="Patch grid (h, w); default the grid set by the patch embedding of the build."
    )


@primitive(
    "fourier_positions",
    args=FourierPositionsArgs,
    kind="preprocess",
    objective="none (token positions)",
    equation="XCiT (Ali et al. 2021) PositionalEncodingFourier; ToST (002 Table 5.3)",
    update="Z + W · [sin, cos](2π (y, x) / T^(2i/h)) + b",
    description="Add XCiT's Fourier position encoding: sin/cos of the normalized (y, x) grid through a learned 1x1 projection.",
    example=Example(args={"grid": (2, 2)}, shape=(4, 16)),
)
def fourier_positions(args: FourierPositionsArgs, shape: Shape, context: Context) -> nn.Module:
    dim = token_dim(shape, "fourier_positions")
    in_order(context, "fourier_positions")
    if args.hidden % 2:
        raise ValueError(f"fourier_positions: hidden={args.hidden} must be even (sin/cos pairs)")
    grid = args.grid or context.grid
    if grid is None:
        raise ValueError(
            "fourier_positions needs the patch grid: put it after a patch embedding that sets it "
            "(conv_patch_embed) or give grid: [h, w]"
        )
    if grid[0] * grid[1] != shape[0]:
        raise ValueError(
            f"fourier_positions: the grid {tuple(grid)} has {grid[0] * grid[1]} cells but the input has "
            f"{shape[0]} tokens (add positions before the class token)"
        )
    return FourierPositions(dim, tuple(grid), hidden=args.hidden, temperature=args.temperature)


# ------------------------------------------------------------------------------- class attention


class ClassAttention(Residual):
    """``x + [CA(LN x); LN(x)_patches]``: only the class token (token 0) queries (CaiT; XCiT/ToST code).

    XCiT's ``ClassAttention`` returns the normalized patch tokens beside the attended class token,
    and the block adds that whole output (times LayerScale) to ``x``: the branch keeps them.
    """

    def __init__(
        self, dim: int, heads: int, *, qkv_bias: bool = True, norm: bool = True, eps: float = 1e-6
    ) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim_of(heads, None, dim)
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)  # (B, n, d)
        q, k, v = self.qkv(y).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)  # (B, K, n, p)
        cls = F.scaled_dot_product_attention(q[:, :, :1], k, v)  # (B, K, 1, p): softmax(q_cls k^T / sqrt p) v
        cls = self.proj(cls.transpose(1, 2).flatten(2))  # (B, 1, d)
        return x, torch.cat([cls, y[:, 1:]], dim=1)


class ClassAttentionArgs(Args):
    heads: int = Field(ge=1, description="Number of attention heads K; p = d / K.")
    qkv_bias: bool = Field(default=True, description="Bias on the Q/K/V projection (ToST, XCiT: yes).")
    norm: bool = Field(default=True, description="Apply LayerNorm to all tokens first (CaiT, XCiT, ToST: yes).")
    eps: float = Field(default=1e-6, gt=0, description="LayerNorm epsilon (CaiT, XCiT, ToST: 1e-6).")


@primitive(
    "class_attention",
    args=ClassAttentionArgs,
    kind="attention",
    objective="none (pools the tokens into the class token)",
    equation="CaiT (Touvron et al. 2021) Sec. 3; XCiT ClassAttentionBlock; ToST (002 Table 5.3)",
    update=lambda args: "Z + [W_o softmax(q_cls Kᵀ/√p) V;  Y_patches],  Y = " + ("LN Z" if args.norm else "Z"),
    description="Class attention: only the class token (first) queries all tokens; patch tokens get their "
    "normalized values added, as XCiT's code does.",
    example=Example(args={"heads": 2}, shape=(5, 16)),
)
def class_attention(args: ClassAttentionArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "class_attention")
    if shape[0] < 2:
        raise ValueError(f"class_attention needs a class token and at least one other token; got {shape[0]} tokens")
    return ClassAttention(dim, args.heads, qkv_bias=args.qkv_bias, norm=args.norm, eps=args.eps)


class ClassMLP(Residual):
    """``y + [MLP(y_cls); 0]`` with ``y = LN(x)`` over all tokens (XCiT's block, ``tokens_norm=True``).

    XCiT's and ToST's code computes ``x_res + cat([gamma2 * mlp(y_cls), y[:, 1:]])`` with
    ``x_res = y``: the patch tokens come out as ``2 y``. ``patches: doubled`` (default) reproduces
    that; ``patches: normalized`` passes them as ``y``. LayerScale scales the class token's MLP only.
    """

    def __init__(
        self, dim: int, hidden: int, *, doubled: bool = True, norm: bool = True, eps: float = 1e-6
    ) -> None:
        super().__init__()
        self.doubled = doubled
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.expand = nn.Linear(dim, hidden)
        self.contract = nn.Linear(hidden, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)  # (B, n, d)
        cls = self.contract(F.gelu(self.expand(y[:, :1])))  # (B, 1, d)
        patches = 2 * y[:, 1:] if self.doubled else y[:, 1:]
        skip = torch.cat([y[:, :1], patches], dim=1)
        return skip, torch.cat([cls, torch.zeros_like(y[:, 1:])], dim=1)


class ClassMLPArgs(Args):
    ratio: float = Field(default=4.0, gt=0, description="Hidden width of the MLP as a multiple of d (ToST: 4).")
    patches: Literal["doubled", "normalized"] = Field(
        default="doubled",
        description="Patch tokens out: 'doubled' = 2 LN(x), as XCiT's and ToST's code computes "
        "(x_res + cat([mlp(cls), x[:, 1:]])); 'normalized' = LN(x). Only the class token feeds the head.",
    )
    norm: bool = Field(default=True, description="LayerNorm over all tokens first (XCiT tokens_norm=True, ToST: yes).")
    eps: float = Field(default=1e-6, gt=0, description="LayerNorm epsilon (XCiT, ToST: 1e-6).")


@primitive(
    "class_mlp",
    args=ClassMLPArgs,
    kind="mlp",
    objective="none (refines the class token)",
    equation="CaiT (Touvron et al. 2021) Sec. 3; XCiT ClassAttentionBlock (tokens_norm); ToST (002 Table 5.3)",
    update=lambda args: ("[Y_cls + W₂ GELU(W₁ Y_cls);  " + ("2 Y_patches]" if args.patches == "doubled" else "Y_patches]"))
    + (",  Y = LN Z" if args.norm else ",  Y = Z"),
    description="MLP on the class token only, after a LayerNorm over all tokens (second half of XCiT's class-attention block).",
    example=Example(args={"ratio": 2.0}, shape=(5, 16)),
)
def class_mlp(args: ClassMLPArgs, shape: Shape) -> nn.Module:
    dim = token_dim(shape, "class_mlp")
    return ClassMLP(
        dim, int(round(dim * args.ratio)), doubled=args.patches == "doubled", norm=args.norm, eps=args.eps
    )
