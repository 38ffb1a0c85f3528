"""Masked autoencoding: hide a random fraction of image tokens (MAE, He et al.; CRATE-MAE, 001 App. B.1).

Two modes:

* ``replace`` (CRATE-MAE's code): hidden tokens are replaced by a learned mask token; the encoder
  and decoder see every position.
* ``drop`` (He et al.'s MAE): hidden tokens are removed before the encoder; the decoder's
  ``unmask`` step puts mask tokens back in their places.

The step publishes ``mask`` (``(B, m)``, 1 = hidden, in image-token order) and ``restore`` (the
permutation that puts shuffled tokens back), which later steps and the loss read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..registry import Args, Context, Example, Footprint, Inverse, Shape, primitive, token_dim

if TYPE_CHECKING:
    from torch import nn


class MaskArgs(Args):
    ratio: float = Field(default=0.75, ge=0, lt=1, description="Fraction of image tokens hidden (MAE: 0.75).")
    mode: Literal["replace", "drop"] = Field(
        default="replace",
        description="'replace': hidden tokens become a learned mask token (CRATE-MAE); "
        "'drop': they are removed before the encoder (He et al.'s MAE).",
    )
    skip: int = Field(default=0, ge=0, description="Leading tokens never hidden (1 after a class token).")


def _unmask_rule(args: MaskArgs, shape: Shape) -> dict | None:
    if args.mode == "replace":
        return None  # every position is already present: nothing to undo
    tokens = shape[0] - args.skip
    return {"tokens": tokens, "visible": tokens - int(round(tokens * args.ratio))}


@primitive(
    "mask",
    args=MaskArgs,
    kind="mask",
    objective="none (defines the masked-reconstruction task)",
    equation="001 App. B.1; He et al. 2022",
    update="hide a random fraction of tokens",
    description="Hide a random fraction of image tokens: replaced by a mask token, or dropped.",
    inverse=Inverse("unmask", _unmask_rule, where="prologue"),
    publishes=("mask", "restore"),
    example=Example({"ratio": 0.5, "mode": "replace"}, (16, 32)),
    footprint=lambda args, shape, context: _mask_footprint(args, shape, context),
)
def mask(args: MaskArgs, shape: Shape) -> nn.Module:
    from ..modules.mask import Mask

    return Mask(shape[-1], shape[0] - args.skip, ratio=args.ratio, mode=args.mode, skip=args.skip)


def _mask_footprint(args: MaskArgs, shape: Shape, context: Context) -> Footprint:
    """Tokens ``(n, d)``; ``m = n - skip`` of them can be hidden and ``keep = m - round(m * ratio)``
    stay visible. Out: ``(n, d)`` (replace) or ``(skip + keep, d)`` (drop); ``mask`` and
    ``restore`` have ``m`` entries per sample."""
    dim = token_dim(shape, "mask")
    tokens = shape[0] - args.skip
    if tokens < 1:
        raise ValueError(f"skip={args.skip} leaves no tokens to mask out of {shape[0]}")
    if args.mode == "drop":
        context.shuffled = True
        keep = tokens - int(round(tokens * args.ratio))
        return Footprint((args.skip + keep, dim), publishes=((tokens,), (tokens,)))
    return Footprint(shape, {"mask_token": (1, 1, dim)}, publishes=((tokens,), (tokens,)))


class UnmaskArgs(Args):
    tokens: int = Field(ge=1, description="Number of image tokens before masking.")
    visible: int = Field(ge=1, description="Number of tokens the mask step kept.")


@primitive(
    "unmask",
    args=UnmaskArgs,
    kind="mask",
    objective="none",
    equation="He et al. 2022 (MAE decoder input)",
    update="[Z_visible, m, …] in original order",
    description="Inverse of mask (drop mode): insert learned mask tokens and unshuffle.",
    consumes=("restore",),
    example=Example({"tokens": 16, "visible": 8}, (8, 32)),
    footprint=lambda args, shape, context, restore=None: _unmask_footprint(args, shape, context, restore),
)
def unmask(args: UnmaskArgs, shape: Shape) -> nn.Module:
    from ..modules.mask import Unmask

    return Unmask(shape[-1], args.tokens, skip=shape[0] - args.visible)


def _unmask_footprint(args: UnmaskArgs, shape: Shape, context: Context, restore: Shape | None) -> Footprint:
    """``skip + visible`` tokens in, ``skip + tokens`` out, in their original order (``restore``:
    the per-sample shape of the mask's restoring order, when known)."""
    dim = token_dim(shape, "unmask")
    skip = shape[0] - args.visible
    if skip < 0 or args.visible > args.tokens:
        raise ValueError(f"{shape[0]} input tokens cannot hold {args.visible} visible tokens of {args.tokens}")
    if restore is not None and tuple(restore) != (args.tokens,):
        raise ValueError(f"unmask puts back {args.tokens} tokens, but the mask's restore order has {restore[0]}")
    context.shuffled = False  # every token is back in its place
    return Footprint((skip + args.tokens, dim), {"mask_token": (1, 1, dim)})
