"""The modules of :mod:`crate_compose.primitives.embed`: patch embeddings, class token, positions,
pixel head (003 Alg. 1; 001 Sec. 3).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

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


class ClassToken(nn.Module):
    """Prepend a learned class token (init randn, 003 Alg. 1): ``(B, n, d) -> (B, n+1, d)``."""

    def __init__(self, dim: int, *, init: str = "randn") -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, dim))
        if init == "trunc_normal":  # ToST / XCiT: truncated normal, std 0.02
            nn.init.trunc_normal_(self.token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


def sincos_2d(dim: int, grid: tuple[int, int], leading: int = 0) -> torch.Tensor:
    """The fixed 2-D sine-cosine table of MAE: ``(leading + h*w, dim)``; leading rows are zero.

    Half of the features encode the row, half the column; each half is ``[sin(pos w), cos(pos w)]``
    with frequencies ``w_i = 10000^(-i / (dim/4))``.
    """
    if dim % 4:
        raise ValueError(f"sine-cosine positions need d divisible by 4; got d={dim}")
    h, w = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    # MAE's convention: the first half encodes the width coordinate, the second the height.
    table = torch.cat([encode(cols), encode(rows)], dim=1)
    return torch.cat([torch.zeros(leading, dim, dtype=torch.float64), table]).float()


def position_table(init: str, tokens: int, dim: int, *, grid: tuple[int, int] | None = None) -> torch.Tensor | None:
    """The initial table of a ``positions`` step: ``None`` for ``randn`` (drawn by :class:`Positions`),
    ``N(0, 0.02^2)`` for ``normal``, the sine-cosine table on ``grid`` for ``sincos2d``."""
    if init == "normal":
        return torch.randn(tokens, dim) * 0.02
    if init == "sincos2d":
        return sincos_2d(dim, grid, leading=tokens - grid[0] * grid[1])
    return None


class Positions(nn.Module):
    """Add a position embedding of shape ``(1, N, d)`` (003 Alg. 1; 001 Sec. 3); a sequence of
    ``n <= N`` tokens gets its first ``n`` rows (a language model's shorter contexts). With ``grid``
    ``(h, w)`` (the ``interpolate`` option), the table's last ``h*w`` rows are a patch grid, and tokens of a
    square image of another size get that grid resized bicubically to theirs (DINO's
    ``interpolate_pos_encoding``; Caron et al. 2021); the rows before the grid are kept."""

    def __init__(
        self,
        tokens: int,
        dim: int,
        *,
        table: torch.Tensor | None = None,
        trainable: bool = True,
        grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        init = torch.randn(1, tokens, dim) if table is None else table.reshape(1, tokens, dim).clone()
        self.embedding = nn.Parameter(init, requires_grad=trainable)
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grid is not None and x.shape[1] != self.embedding.shape[1]:
            return x + self.resized(x.shape[1]).to(x.dtype)
        return self.decode(x, 0)[0]

    def resized(self, tokens: int) -> torch.Tensor:
        """The table for ``tokens`` tokens: the leading rows as they are, the grid resized to the square grid of
        ``tokens`` minus those rows."""
        h, w = self.grid
        leading = self.embedding.shape[1] - h * w
        side = math.isqrt(max(tokens - leading, 0))
        if tokens <= leading or side * side != tokens - leading:
            raise ValueError(
                f"{tokens} tokens are no square patch grid after {leading} leading tokens: interpolated "
                f"positions take square images (the table's grid is {h}x{w})"
            )
        cells = self.embedding[:, leading:].reshape(1, h, w, -1).permute(0, 3, 1, 2)
        # DINO's sampling: a scale factor of (side + 0.1) / h, which sizes the output side x side and sets where
        # it samples (a size= call would sample at h / side, a little apart)
        resized = F.interpolate(cells.float(), scale_factor=((side + 0.1) / h, (side + 0.1) / w), mode="bicubic")
        resized = resized.to(self.embedding.dtype).permute(0, 2, 3, 1).reshape(1, side * side, -1)
        return torch.cat([self.embedding[:, :leading], resized], dim=1)

    def decode(self, x: torch.Tensor, offset: int | None) -> tuple[torch.Tensor, int]:
        """Positions ``offset .. offset + n - 1`` for ``n`` new tokens; the state is the tokens seen."""
        offset = offset or 0
        end = offset + x.shape[1]
        if end > self.embedding.shape[1]:
            raise ValueError(f"{end} tokens, but the position table holds {self.embedding.shape[1]} (the context size)")
        return x + self.embedding[:, offset:end], end


class PixelHead(nn.Module):
    """``LN -> Linear(d, P*P*C)``: predict each token's patch of pixels, ``(p1 p2 c)`` order (001 Sec. 3)."""

    def __init__(self, dim: int, patch_size: int, channels: int, *, norm: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.predict = nn.Linear(dim, patch_size * patch_size * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predict(self.norm(x))


class DropTokens(nn.Module):
    """Drop the first ``count`` tokens (the class token): ``(B, n, d) -> (B, n - count, d)``."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.count :]
