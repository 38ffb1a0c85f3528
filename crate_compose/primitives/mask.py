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

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from ..registry import Args, Context, Example, Inverse, Shape, primitive, token_dim


def _mask_token(dim: int) -> nn.Parameter:
    token = nn.Parameter(torch.zeros(1, 1, dim))
    nn.init.normal_(token, std=0.02)  # as MAE
    return token


class Mask(nn.Module):
    """Hide ``ratio`` of the tokens after the first ``skip`` (a class token is never hidden)."""

    def __init__(self, dim: int, tokens: int, *, ratio: float, mode: str, skip: int) -> None:
        super().__init__()
        self.tokens, self.skip, self.mode = tokens, skip, mode
        self.keep = tokens - int(round(tokens * ratio))
        self.mask_token = _mask_token(dim) if mode == "replace" else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        prefix, tokens = x[:, : self.skip], x[:, self.skip :]  # (B, s, d), (B, m, d)
        order = torch.rand(x.shape[0], self.tokens, device=x.device).argsort(dim=1)  # visible first
        restore = order.argsort(dim=1)
        hidden = (torch.arange(self.tokens, device=x.device) >= self.keep).to(x.dtype)
        mask = hidden.expand(x.shape[0], -1).gather(1, restore)  # (B, m), 1 = hidden
        if self.mask_token is not None:
            tokens = torch.where(mask.unsqueeze(-1) > 0, self.mask_token.to(x.dtype), tokens)
        else:
            index = order[:, : self.keep].unsqueeze(-1).expand(-1, -1, x.shape[-1])
            tokens = tokens.gather(1, index)  # (B, keep, d)
        return torch.cat([prefix, tokens], dim=1), mask, restore


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
)
def mask(args: MaskArgs, shape: Shape, context: Context) -> nn.Module:
    tokens = shape[0] - args.skip
    if tokens < 1:
        raise ValueError(f"skip={args.skip} leaves no tokens to mask out of {shape[0]}")
    if args.mode == "drop":
        context.shuffled = True
    return Mask(token_dim(shape, "mask"), tokens, ratio=args.ratio, mode=args.mode, skip=args.skip)


class Unmask(nn.Module):
    """Put mask tokens back where tokens were dropped, restoring the original order.

    Tokens before the visible ones (a class token added after masking) are kept in front.
    """

    def __init__(self, dim: int, tokens: int, *, skip: int) -> None:
        super().__init__()
        self.tokens, self.skip = tokens, skip
        self.mask_token = _mask_token(dim)

    def forward(self, x: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        prefix, visible = x[:, : self.skip], x[:, self.skip :]
        fill = self.mask_token.to(x.dtype).expand(x.shape[0], self.tokens - visible.shape[1], -1)
        index = restore.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        return torch.cat([prefix, torch.cat([visible, fill], dim=1).gather(1, index)], dim=1)


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
)
def unmask(args: UnmaskArgs, shape: Shape, context: Context) -> nn.Module:
    skip = shape[0] - args.visible
    if skip < 0 or args.visible > args.tokens:
        raise ValueError(f"{shape[0]} input tokens cannot hold {args.visible} visible tokens of {args.tokens}")
    context.shuffled = False  # every token is back in its place
    return Unmask(token_dim(shape, "unmask"), args.tokens, skip=skip)
