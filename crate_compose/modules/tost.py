"""The modules of :mod:`crate_compose.primitives.tost`: ToST's vision parts (XCiT, CaiT).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .causal import attention_weights, softmax_attention
from .precision import LayerNorm
from .residual import Residual


class ConvStemPatchEmbed(nn.Module):
    """``(B, C, H, W) -> (B, (H/P)(W/P), d)``: XCiT's convolutional stem (its ``ConvPatchEmbed``), strided
    3x3 convolutions each followed by BatchNorm, with GELU between them."""

    def __init__(self, channels: int, dim: int, patch_size: int = 16) -> None:
        super().__init__()
        widths = [channels] + [dim // 2**i for i in reversed(range(int(math.log2(patch_size))))]  # C, d/8, .., d
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:])):
            if i:
                layers.append(nn.GELU())  # between the convolutions, not after the last
            layers.append(
                nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out))
            )
        self.proj = nn.Sequential(*layers)  # the authors' layout: proj.0.0 conv, proj.0.1 BN, proj.1 GELU, ...

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, d, H/P, W/P) -> (B, n, d), row-major grid


def fourier_features(
    grid: tuple[int, int], hidden: int, temperature: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """XCiT's sin/cos features ``(1, 2*hidden, H, W)``: first the y (row) half, then the x half, computed in
    float32 as the authors' code computes them (the caller casts them to the model's dtype).

    Coordinates are ``1..H`` (``1..W``, the running count of the grid's cells), divided by ``H + 1e-6``
    and scaled by ``2 pi``; feature ``2i`` is ``sin(pos / T^(2i/hidden))`` and ``2i+1`` is
    ``cos(pos / T^(2i/hidden))``. Computed with the same float32 operations in the same order as theirs,
    so the features agree with theirs to the last bit, at any grid.
    """
    h, w = grid
    scale, eps = 2 * math.pi, 1e-6
    ones = torch.ones(1, h, w, dtype=torch.float32, device=device)
    y, x = ones.cumsum(1), ones.cumsum(2)  # (1, H, W): 1..H down the rows, 1..W along them
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    dim_t = torch.arange(hidden, dtype=torch.float32, device=device)
    dim_t = temperature ** (2 * (dim_t // 2) / hidden)  # (hidden,)

    def encode(pos: torch.Tensor) -> torch.Tensor:  # (1, H, W) -> (1, H, W, hidden), sin/cos interleaved
        angles = pos[:, :, :, None] / dim_t
        return torch.stack((angles[:, :, :, 0::2].sin(), angles[:, :, :, 1::2].cos()), dim=4).flatten(3)

    return torch.cat((encode(y), encode(x)), dim=3).permute(0, 3, 1, 2)  # (1, 2 hidden, H, W)


def grid_of(tokens: int, built: tuple[int, int]) -> tuple[int, int]:
    """The patch grid of ``tokens`` tokens with the aspect ratio of the ``built`` grid (``h/w``): any image
    whose sides the patch size divides, in the build's proportions (the square of any side for a square build)."""
    if tokens == built[0] * built[1]:
        return built
    a, b = built[0] // math.gcd(*built), built[1] // math.gcd(*built)
    k = math.isqrt(tokens // (a * b)) if tokens % (a * b) == 0 else 0
    if k < 1 or a * b * k * k != tokens:
        raise ValueError(
            f"fourier_positions: {tokens} tokens do not form a patch grid of the build's proportions "
            f"{a}:{b} (built for {built[0]}x{built[1]}); give images whose sides keep them"
        )
    return a * k, b * k


class FourierPositions(nn.Module):
    """``x + Conv1x1(fourier(grid))``: XCiT's ``PositionalEncodingFourier``, added to ``(B, H*W, d)`` tokens.

    The grid is the input's (:func:`grid_of`): the features of the grid the network was built for are kept,
    any other grid's are computed when it comes, so a ToST takes images of other resolutions as its authors'
    code does."""

    def __init__(self, dim: int, grid: tuple[int, int], *, hidden: int = 32, temperature: float = 10000.0) -> None:
        super().__init__()
        self.grid, self.hidden, self.temperature = tuple(grid), hidden, temperature
        self.token_projection = nn.Conv2d(2 * hidden, dim, kernel_size=1)  # the authors' name
        self.register_buffer("features", fourier_features(self.grid, hidden, temperature), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.token_projection.weight
        grid = grid_of(x.shape[1], self.grid)
        features = (
            self.features if grid == self.grid else fourier_features(grid, self.hidden, self.temperature, weight.device)
        )
        # the 1x1 convolution as the product it is: cuDNN would take float32 convolutions in TF32 on a GPU
        pos = F.linear(
            features.to(weight.dtype).flatten(2).transpose(1, 2), weight.flatten(1), self.token_projection.bias
        )  # (1, H*W, d)
        return x + pos


class ClassAttention(Residual):
    """``x + [CA(LN x); LN(x)_patches]``: only the class token (token 0) queries (CaiT; XCiT/ToST code).

    XCiT's ``ClassAttention`` returns the normalized patch tokens beside the attended class token,
    and the block adds that whole output (times LayerScale) to ``x``: the branch keeps them.
    """

    def __init__(self, dim: int, heads: int, *, qkv_bias: bool = True, norm: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads  # d divides by heads (the footprint checks)
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)  # (B, n, d)
        q, k, v = self.qkv(y).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)  # (B, K, n, p)
        cls = softmax_attention(q[:, :, :1], k, v)  # (B, K, 1, p): softmax(q_cls k^T / sqrt p) v
        cls = self.proj(cls.transpose(1, 2).flatten(2))  # (B, 1, d)
        return x, torch.cat([cls, y[:, 1:]], dim=1)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """``softmax(q_cls k^T / sqrt p)`` ``(B, K, 1, n)``: the weights the class token applies to every token
        (the pictures of ``crate-compose show``; in float32 for half inputs)."""
        q, k = self.qkv(self.norm(x)).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)[:2]
        return attention_weights(q[:, :, :1], k)


class ClassMLP(Residual):
    """``y + [MLP(y_cls); 0]`` with ``y = LN(x)`` over all tokens (XCiT's block, ``tokens_norm=True``).

    XCiT's and ToST's code computes ``x_res + cat([gamma2 * mlp(y_cls), y[:, 1:]])`` with
    ``x_res = y``: the patch tokens come out as ``2 y``. ``patches: doubled`` (default) reproduces
    that; ``patches: normalized`` passes them as ``y``. LayerScale scales the class token's MLP only.
    """

    def __init__(self, dim: int, hidden: int, *, doubled: bool = True, norm: bool = True, eps: float = 1e-6) -> None:
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
