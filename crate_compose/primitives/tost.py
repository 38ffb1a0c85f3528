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
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Context, Example, Footprint, Shape, primitive, token_dim
from .compress import head_dim_of
from .embed import TO_PIXELS, in_order
from .parts import batchnorm, conv2d, layernorm, linear
from .standard import mlp_footprint

if TYPE_CHECKING:
    from torch import nn


class ConvPatchEmbedArgs(Args):
    dim: int = Field(ge=1, description="Token dimension d (divisible by P/2: 8 for patch 16, 4 for patch 8).")
    patch_size: Literal[2, 4, 8, 16] = Field(
        default=16,
        description="Side P of the patches: log2(P) stride-2 convolutions: 16 (four) or 8 (three), as "
        "XCiT; 4 (two) or 2 (one) for small images (28x28, 8x8).",
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
    footprint=lambda args, shape, context: _conv_footprint(args, shape, context),
)
def conv_patch_embed(args: ConvPatchEmbedArgs, shape: Shape) -> nn.Module:
    from ..modules.tost import ConvStemPatchEmbed

    return ConvStemPatchEmbed(shape[0], args.dim, args.patch_size)


def _conv_footprint(args: ConvPatchEmbedArgs, shape: Shape, context: Context) -> Footprint:
    """Images ``(C, H, W)`` to ``(H/P * W/P, d)`` tokens through ``log2 P`` stride-2 convolutions
    (``C -> d/2^(s-1) -> .. -> d``), each followed by BatchNorm; sets the patch grid of the build."""
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
    widths = [c] + [args.dim // 2**i for i in reversed(range(stages + 1))]
    parameters: dict[str, Shape] = {}
    for i, (inputs, outputs) in enumerate(zip(widths[:-1], widths[1:])):  # proj.0, proj.2, ..: GELU between
        parameters.update(conv2d(f"proj.{2 * i}.0", inputs, outputs, 3, bias=False))
        parameters.update(batchnorm(f"proj.{2 * i}.1", outputs))
    return Footprint((context.grid[0] * context.grid[1], args.dim), parameters)


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
    footprint=lambda args, shape, context: _fourier_footprint(args, shape, context),
)
def fourier_positions(args: FourierPositionsArgs, shape: Shape, context: Context) -> nn.Module:
    from ..modules.tost import FourierPositions

    return FourierPositions(
        shape[-1], _fourier_grid(args, shape, context), hidden=args.hidden, temperature=args.temperature
    )


def _fourier_grid(args: FourierPositionsArgs, shape: Shape, context: Context) -> tuple[int, int]:
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
    return tuple(grid)  # type: ignore[return-value]


def _fourier_footprint(args: FourierPositionsArgs, shape: Shape, context: Context) -> Footprint:
    """Tokens ``(h*w, d)`` in, the same out: a 1x1 convolution ``2 hidden -> d`` of the features."""
    dim = token_dim(shape, "fourier_positions")
    in_order(context, "fourier_positions")
    if args.hidden % 2:
        raise ValueError(f"fourier_positions: hidden={args.hidden} must be even (sin/cos pairs)")
    _fourier_grid(args, shape, context)
    return Footprint(shape, conv2d("token_projection", 2 * args.hidden, dim, 1))


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
    footprint=lambda args, shape, context: _attention_footprint(args, shape),
)
def class_attention(args: ClassAttentionArgs, shape: Shape) -> nn.Module:
    from ..modules.tost import ClassAttention

    return ClassAttention(shape[-1], args.heads, qkv_bias=args.qkv_bias, norm=args.norm, eps=args.eps)


def _attention_footprint(args: ClassAttentionArgs, shape: Shape) -> Footprint:
    """Tokens ``(n, d)``, a class token first: ``LN(d)``, ``Q, K, V: d -> 3d``, ``proj: d -> d``; residual."""
    dim = token_dim(shape, "class_attention")
    if shape[0] < 2:
        raise ValueError(f"class_attention needs a class token and at least one other token; got {shape[0]} tokens")
    head_dim_of(args.heads, None, dim)  # d divides into the heads
    parameters = {
        **layernorm("norm", dim, present=args.norm),
        **linear("qkv", dim, 3 * dim, bias=args.qkv_bias),
        **linear("proj", dim, dim),
    }
    return Footprint(shape, parameters, residual=True)


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
    update=lambda args: (
        ("[Y_cls + W₂ GELU(W₁ Y_cls);  " + ("2 Y_patches]" if args.patches == "doubled" else "Y_patches]"))
        + (",  Y = LN Z" if args.norm else ",  Y = Z")
    ),
    description="MLP on the class token only, after a LayerNorm over all tokens (second half of XCiT's class-attention block).",
    example=Example(args={"ratio": 2.0}, shape=(5, 16)),
    footprint=lambda args, shape, context: mlp_footprint(args, shape, "class_mlp"),
)
def class_mlp(args: ClassMLPArgs, shape: Shape) -> nn.Module:
    from ..modules.tost import ClassMLP

    dim = shape[-1]
    return ClassMLP(dim, int(round(dim * args.ratio)), doubled=args.patches == "doubled", norm=args.norm, eps=args.eps)
