"""DINO's multi-crop views of a batch of images (Caron et al. 2021, Sec. 3.1; ``main_dino.py``'s
``DataAugmentationDINO``): two global crops and ``N`` local ones of every image, each with its own flip,
colour jitter, greyscale, blur and (the second global view) solarization.

DINO's crops are 224 pixels (scale 0.4-1 of the image's area) and 96 pixels (scale 0.05-0.4); here the
global crops are the images' own size and the local ones ``96/224`` of it, in whole patches
(:func:`local_size`), so a 32-pixel image with 4-pixel patches gets 12-pixel local crops (a 3x3 grid; the
position table is interpolated, :class:`crate_compose.modules.embed.Positions`).

Each view of a whole batch is made in a few batched tensor operations, every image with parameters of its
own (DINO draws them per image with PIL, one image at a time, in its data loader's workers; on a CPU that
costs seconds a step): the crop and flip as one bilinear resampling (``grid_sample`` of an affine map per
image: RandomResizedCrop's area and aspect ratio, uniform position), brightness, contrast and saturation
factors per image (ColorJitter 0.4, 0.4, 0.2, applied with probability 0.8; hue's 0.1 is left out), greyscale
with probability 0.2, a Gaussian blur whose sigma is uniform in (0.1, 2) pixels, and solarization of
pixels above 0.5. Pixels are in [0, 1]; every draw comes from torch's RNG, which the caller seeds per step,
so a resumed run draws the same views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

GLOBAL_SCALE = (0.4, 1.0)  # DINO's --global_crops_scale
LOCAL_SCALE = (0.05, 0.4)  # DINO's --local_crops_scale
RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect ratios
DINO_SIZES = (224, 96)  # DINO's global and local crop sides: the ratio the local crops keep
JITTER = {"brightness": 0.4, "contrast": 0.4, "saturation": 0.2, "hue": 0.1}  # DINO's ColorJitter
LUMA = (0.299, 0.587, 0.114)  # the greyscale of an RGB pixel (ITU-R 601-2, as PIL and torchvision)


@dataclass(frozen=True)
class MultiCrop:
    """The sides of the global and local crops, and how many local crops each image gets."""

    global_size: int
    local_size: int
    local_crops: int  # DINO's --local_crops_number (task dino's option local_crops)

    @property
    def views(self) -> int:
        return 2 + self.local_crops


@dataclass(frozen=True)
class View:
    """One view's recipe: its side, crop scale, and the probabilities of blur and solarization."""

    size: int
    scale: tuple[float, float]
    blur: float
    solarize: float = 0.0


def local_size(image_size: int, patch: int) -> int:
    """The side of a local crop: ``96/224`` of the image's, rounded to whole patches, at least 2 patches."""
    cells = max(2, round(image_size / patch * DINO_SIZES[1] / DINO_SIZES[0]))
    return cells * patch


def recipes(crop: MultiCrop) -> list[View]:
    """Global 1 (blur always), global 2 (blur p 0.1, solarization p 0.2), the local ones (blur p 0.5)."""
    return [
        View(crop.global_size, GLOBAL_SCALE, 1.0),
        View(crop.global_size, GLOBAL_SCALE, 0.1, 0.2),
        *[View(crop.local_size, LOCAL_SCALE, 0.5)] * crop.local_crops,
    ]


def views(pixels: torch.Tensor, crop: MultiCrop) -> list[torch.Tensor]:
    """The views of a batch ``(B, C, H, W)`` of pixels in [0, 1]: ``2 + local_crops`` tensors, the global
    ones ``(B, C, G, G)`` then the local ones ``(B, C, L, L)``, each image with parameters of its own."""
    return [view(pixels, recipe) for recipe in recipes(crop)]


def view(pixels: torch.Tensor, recipe: View) -> torch.Tensor:
    out = resized_crops(pixels, recipe.size, recipe.scale)
    out = color_jitter(out)
    out = grayscale(out, 0.2) if out.shape[1] == 3 else out
    out = blur(out, recipe.blur)
    if recipe.solarize:
        flip = (torch.rand(len(out), 1, 1, 1, device=out.device) < recipe.solarize) & (out >= 0.5)
        out = torch.where(flip, 1 - out, out)
    return out.clamp(0, 1)


def _chosen(count: int, p: float, device) -> torch.Tensor:
    """Which of ``count`` images a transform applied with probability ``p`` applies to, as (count, 1, 1, 1)."""
    return (torch.rand(count, device=device) < p).view(-1, 1, 1, 1)


def resized_crops(pixels: torch.Tensor, size: int, scale: tuple[float, float]) -> torch.Tensor:
    """RandomResizedCrop and a horizontal flip (p 0.5) of every image: a crop of ``scale`` of the area and an
    aspect ratio log-uniform in 3/4-4/3 (clipped to the image), at a uniform position, resampled bilinearly to
    ``size`` x ``size``."""
    count, device = len(pixels), pixels.device
    area = torch.empty(count, device=device).uniform_(*scale)
    ratio = torch.exp(torch.empty(count, device=device).uniform_(math.log(RATIO[0]), math.log(RATIO[1])))
    width = torch.sqrt(area * ratio).clamp(max=1.0)  # as fractions of the image's side
    height = torch.sqrt(area / ratio).clamp(max=1.0)
    left = torch.rand(count, device=device) * (1 - width)
    top = torch.rand(count, device=device) * (1 - height)
    flip = torch.where(torch.rand(count, device=device) < 0.5, -1.0, 1.0)
    theta = torch.zeros(count, 2, 3, device=device)
    theta[:, 0, 0] = width * flip  # x in [-1, 1] of the output -> the crop's columns, mirrored when flipped
    theta[:, 0, 2] = 2 * left + width - 1
    theta[:, 1, 1] = height
    theta[:, 1, 2] = 2 * top + height - 1
    grid = F.affine_grid(theta, [count, pixels.shape[1], size, size], align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


def color_jitter(pixels: torch.Tensor) -> torch.Tensor:
    """DINO's ColorJitter, applied to each image with probability 0.8: brightness, contrast and (RGB)
    saturation factors drawn per image, uniform in 1 +- 0.4, 0.4 and 0.2, and (RGB) a hue shift uniform in
    +- 0.1 of a turn, in that order (torchvision draws an order per call; the factors are its)."""
    count, device = len(pixels), pixels.device

    def drawn(name: str) -> torch.Tensor:
        return torch.empty(count, 1, 1, 1, device=device).uniform_(-JITTER[name], JITTER[name])

    applied = _chosen(count, 0.8, device)
    out = (pixels * (1 + drawn("brightness"))).clamp(0, 1)
    mean = _luma(out).mean(dim=(-2, -1), keepdim=True)
    out = (mean + (out - mean) * (1 + drawn("contrast"))).clamp(0, 1)
    if out.shape[1] == 3:
        grey = _luma(out)
        out = (grey + (out - grey) * (1 + drawn("saturation"))).clamp(0, 1)
        out = hue_shift(out, drawn("hue"))
    return torch.where(applied, out, pixels)


def hue_shift(rgb: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Each RGB image ``(B, 3, H, W)`` in [0, 1] with its hue turned by ``shift`` ``(B, 1, 1, 1)`` (in turns):
    to HSV, ``h <- (h + shift) mod 1``, back (torchvision's ``adjust_hue``)."""
    r, g, b = rgb.unbind(1)
    value, _ = rgb.max(1)
    delta = value - rgb.min(1)[0]
    saturation = torch.where(value > 0, delta / torch.where(value > 0, value, torch.ones_like(value)), 0.0)
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    rc, gc, bc = (value - r) / safe, (value - g) / safe, (value - b) / safe
    hue = torch.where(value == r, bc - gc, torch.where(value == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = torch.where(delta > 0, (hue / 6.0) % 1.0, 0.0)
    hue = (hue + shift[:, 0]) % 1.0
    sector = hue * 6.0
    i = torch.floor(sector)
    f = sector - i
    i = i.long() % 6
    p, q, t = value * (1 - saturation), value * (1 - saturation * f), value * (1 - saturation * (1 - f))
    pick = lambda *choices: torch.stack(choices, 1).gather(1, i.unsqueeze(1)).squeeze(1)  # noqa: E731
    return torch.stack(
        [pick(value, q, p, p, t, value), pick(t, value, value, q, p, p), pick(p, p, t, value, value, q)], 1
    )


def grayscale(pixels: torch.Tensor, p: float) -> torch.Tensor:
    """Each RGB image replaced by its luma in every channel with probability ``p``."""
    return torch.where(_chosen(len(pixels), p, pixels.device), _luma(pixels).expand_as(pixels), pixels)


def _luma(pixels: torch.Tensor) -> torch.Tensor:
    if pixels.shape[1] != 3:
        return pixels.mean(1, keepdim=True)
    weights = torch.tensor(LUMA, device=pixels.device, dtype=pixels.dtype).view(1, 3, 1, 1)
    return (pixels * weights).sum(1, keepdim=True)


def blur(pixels: torch.Tensor, p: float) -> torch.Tensor:
    """A Gaussian blur with sigma uniform in (0.1, 2) pixels per image (a separable kernel of radius
    ``ceil(3 sigma_max)``, reflected at the borders), applied with probability ``p``."""
    count, channels, height, width = pixels.shape
    if p <= 0:
        return pixels
    applied = _chosen(count, p, pixels.device)
    sigma = torch.empty(count, device=pixels.device).uniform_(0.1, 2.0)
    radius = min(6, (min(height, width) - 1) // 2)
    if radius < 1:
        return pixels
    offsets = torch.arange(-radius, radius + 1, device=pixels.device, dtype=pixels.dtype)
    kernel = torch.exp(-0.5 * (offsets / sigma[:, None]) ** 2)
    kernel = kernel / kernel.sum(1, keepdim=True)  # (B, k)
    weights = kernel.repeat_interleave(channels, 0)  # one kernel per image and channel: grouped convolutions
    flat = pixels.reshape(1, count * channels, height, width)
    flat = F.conv2d(
        F.pad(flat, (radius, radius, 0, 0), mode="reflect"),
        weights.view(-1, 1, 1, 2 * radius + 1),
        groups=count * channels,
    )
    flat = F.conv2d(
        F.pad(flat, (0, 0, radius, radius), mode="reflect"),
        weights.view(-1, 1, 2 * radius + 1, 1),
        groups=count * channels,
    )
    return torch.where(applied, flat.view(count, channels, height, width), pixels)
