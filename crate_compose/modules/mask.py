"""The modules of :mod:`crate_compose.primitives.mask`: masking and unmasking tokens (MAE; 001 App. B.1).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


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


@contextlib.contextmanager
def unmasked(model: nn.Module) -> Iterator[None]:
    """Every :class:`Mask` of ``model`` hides nothing while inside: its output becomes its input, an
    empty mask and the identity order (a forward hook; the modules are left as they were). The
    encoder of a masked autoencoder then sees every patch, as its features are probed and pictured."""

    def nothing_hidden(module, args, output):
        x = args[0]
        tokens = x.shape[1] - module.skip
        order = torch.arange(tokens, device=x.device).expand(x.shape[0], -1)
        return x, torch.zeros(x.shape[0], tokens, dtype=x.dtype, device=x.device), order

    handles = [m.register_forward_hook(nothing_hidden) for m in model.modules() if isinstance(m, Mask)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
