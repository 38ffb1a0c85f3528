"""DINO's multi-crop views of a batch of images (Caron et al. 2021, Sec. 3.1; ``main_dino.py``'s
``DataAugmentationDINO``): two global crops and ``N`` local ones of every image, each with its own flips,
colour jitter, greyscale, blur and (the second global view) solarization.

DINO's crops are 224 pixels (scale 0.4-1 of the image's area) and 96 pixels (scale 0.05-0.4); here the
global crops are the images' own size and the local ones ``96/224`` of it, in whole patches
(:func:`local_size`), so a 32-pixel image with 4-pixel patches gets 12-pixel local crops (a 3x3 grid; the
position table is interpolated, :class:`crate_compose.modules.embed.Positions`). The views are made from
pixels in [0, 1] and standardized again, every random draw from the torch generator the caller seeds (a
step's own seed: a resumed run draws the same views).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import torch

from ..data.batches import transforms_v2

GLOBAL_SCALE = (0.4, 1.0)  # DINO's --global_crops_scale
LOCAL_SCALE = (0.05, 0.4)  # DINO's --local_crops_scale
LOCAL_CROPS = 8  # DINO's --local_crops_number
DINO_SIZES = (224, 96)  # DINO's global and local crop sides: the ratio the local crops keep


@dataclass(frozen=True)
class MultiCrop:
    """The sides of the global and local crops, and how many local crops each image gets."""

    global_size: int
    local_size: int
    local_crops: int = LOCAL_CROPS

    @property
    def views(self) -> int:
        return 2 + self.local_crops


def local_size(image_size: int, patch: int) -> int:
    """The side of a local crop: ``96/224`` of the image's, rounded to whole patches, at least 2 patches."""
    cells = max(2, round(image_size / patch * DINO_SIZES[1] / DINO_SIZES[0]))
    return cells * patch


def _flip_and_jitter(v2: Any, channels: int) -> list:
    """DINO's flip_and_color_jitter: a horizontal flip, colour jitter (p 0.8) and greyscale (p 0.2); a grey
    image has no saturation, hue or colour to lose, so it is jittered in brightness and contrast only."""
    if channels == 3:
        jitter = v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        return [v2.RandomHorizontalFlip(), v2.RandomApply([jitter], p=0.8), v2.RandomGrayscale(p=0.2)]
    return [v2.RandomHorizontalFlip(), v2.RandomApply([v2.ColorJitter(brightness=0.4, contrast=0.4)], p=0.8)]


def _blur(v2: Any, size: int, p: float) -> Any:
    """DINO's GaussianBlur: sigma uniform in (0.1, 2) pixels, applied with probability ``p``."""
    kernel = min(2 * round(3 * 2.0) + 1, size - 1 if size % 2 == 0 else size)
    return v2.RandomApply([v2.GaussianBlur(kernel_size=kernel, sigma=(0.1, 2.0))], p=p)


def augmentations(crop: MultiCrop, channels: int) -> list[Any]:
    """The transform of each view, in order: global 1 (blur always), global 2 (blur p 0.1, solarization
    p 0.2), then the local ones (blur p 0.5), as DINO's DataAugmentationDINO (torchvision's transforms)."""
    v2 = transforms_v2()

    def crop_of(size: int, scale: tuple[float, float]) -> Any:
        return v2.RandomResizedCrop(size, scale=scale, interpolation=v2.InterpolationMode.BICUBIC, antialias=True)

    first = v2.Compose([crop_of(crop.global_size, GLOBAL_SCALE), *_flip_and_jitter(v2, channels),
                        _blur(v2, crop.global_size, 1.0)])
    second = v2.Compose([crop_of(crop.global_size, GLOBAL_SCALE), *_flip_and_jitter(v2, channels),
                         _blur(v2, crop.global_size, 0.1), v2.RandomSolarize(threshold=0.5, p=0.2)])
    local = v2.Compose([crop_of(crop.local_size, LOCAL_SCALE), *_flip_and_jitter(v2, channels), _blur(v2, crop.local_size, 0.5)])
    return [first, second, *[local] * crop.local_crops]


def views(pixels: torch.Tensor, crop: MultiCrop) -> list[torch.Tensor]:
    """The views of a batch ``(B, C, H, W)`` of pixels in [0, 1]: ``2 + local_crops`` tensors, the global
    ones ``(B, C, G, G)`` then the local ones ``(B, C, L, L)``, each image drawn on its own (torch's RNG)."""
    transforms = augmentations(crop, pixels.shape[1])
    return [torch.stack([transform(image).clamp(0, 1) for image in pixels]) for transform in transforms]
