"""``pasted-digits``: scikit-learn's 8x8 digits pasted on textured backgrounds, with their ground-truth masks.

Every image is generated from ``split_seed``, its split and its index alone, so the set is the same on every
machine and for every run seed, and one image can be made again on its own (:func:`paste`):

* the object: a digit drawn from scikit-learn's ``load_digits`` (from the ``digits`` set's train split for train
  images, from its test split for test images: the test objects are digits never seen in training), its
  intensity (0..16 scaled to [0, 1]) resized (bilinear, as ``digits`` is resized) to a random side between
  10/32 and 24/32 of the image's (10 to 24 pixels at 32; never under 5 pixels, the smallest side at which
  every one of scikit-learn's digits keeps a pixel above 0.5) and pasted at a random place, in a random colour
  (the farthest from the background's mean colour of 8 drawn) with its intensity as alpha:
  ``pixel = alpha * colour + (1 - alpha) * background``;
* the background, of the image's size: smooth coloured noise (a random 2x2 to 5x5 grid of colours, resized),
  stripes or checks of random frequency (1.5 to 6 periods across), orientation, phase, softness and colours,
  or a random mix of two of these;
* the mask: the pixels where the pasted digit's alpha is above 0.5 (never empty);
* the class: the digit's label (10 classes).

RGB (3 channels), ``image_size`` a side (default 32, at least 8), 4,000 train and 1,000 test images by default
(``train_count``, ``test_count``), standardized per channel with the train split's mean and std. Each split's
``masks`` holds its images' masks, ``(N, H, W)`` bool.

How it is drawn: each split has its own random stream (PCG64 seeded with ``[split_seed, 0]`` for train,
``[split_seed, 1]`` for test), and image ``i`` takes the ``DRAWS`` uniform numbers ``i * DRAWS ..`` of it (the
columns of :data:`COLUMNS`), so an image depends neither on the run's seed nor on how many images are made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import DataError
from ...memory import resolve_limit
from ..common import check_memory, stratified_split
from ..record import Data, check_size
from . import generated
from .textures import WIDTHS, backgrounds, pick

__all__ = ["Pasted", "load_pasted_digits", "paste"]

NAME = "pasted-digits"
SIZE, SMALLEST = 32, 8  # the default image side, and the smallest one
SIDES, FEWEST = (10 / 32, 24 / 32), 5  # the pasted digit's side as a share of the image's, and its fewest pixels
SPLITS = generated.SPLITS
TRIES = 8  # the digit's colour: the farthest of this many from the background's
MAX_COUNT = 1_000_000
CACHE_FROM = 10_000  # images (train and test) from which a made set is kept in the cache folder: pasted-digits:40000
# takes 30-90 s to make, and every run start, probe and segment of such a run would make it again
CACHE_VERSION = 1  # in the cached files' names: raised whenever the drawing changes what an image is

# which of an image's uniform numbers draws what: its background (.textures), then its digit
COLUMNS = generated.columns([*WIDTHS, ("digit", 1), ("side", 1), ("top", 1), ("left", 1), ("colour", TRIES * 3)])
DRAWS = max(s.stop for s in COLUMNS.values())  # uniform numbers per image


@dataclass(frozen=True)
class Pasted:
    """One generated image before standardization: ``image`` ``(3, S, S)`` in [0, 1], ``mask`` ``(S, S)`` bool,
    the digit (its index in scikit-learn's ``load_digits`` and its label), where it was pasted (its ``side``
    and the ``top``/``left`` of its square), its colour and the kind of background."""

    image: np.ndarray
    mask: np.ndarray
    digit: int
    label: int
    side: int
    top: int
    left: int
    colour: tuple[float, float, float]
    background: str


def sides(size: int) -> tuple[int, int]:
    """The smallest and largest side of a pasted digit in an image of side ``size``."""
    low = max(FEWEST, math.ceil(SIDES[0] * size))
    return low, max(low, math.floor(SIDES[1] * size))


def alpha_of(digits: np.ndarray, side: int) -> np.ndarray:
    """8x8 digits ``(n, 8, 8)`` in [0, 1] resized (bilinear: torch's ``interpolate``, corners not aligned) to
    ``side`` x ``side`` and clipped to [0, 1]: the alpha each is pasted with, ``(n, side, side)`` float64."""
    grown = torch.nn.functional.interpolate(
        torch.as_tensor(digits, dtype=torch.float64)[:, None], size=(side, side), mode="bilinear", align_corners=False
    )
    return grown[:, 0].clamp(0, 1).numpy()


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def _pools(labels: np.ndarray, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits each split draws its objects from: the ``digits`` set's own stratified split."""
    return stratified_split(labels, 0.2, split_seed, NAME)


def _make(u: np.ndarray, size: int, images: np.ndarray, labels: np.ndarray, pool: np.ndarray):
    """The images ``(n, 3, size, size)`` in [0, 1], their masks ``(n, size, size)`` and what was drawn, from
    their uniform numbers ``(n, DRAWS)``."""
    n = len(u)
    back, kinds = backgrounds(u, COLUMNS, size)
    digit = pool[pick(u[:, COLUMNS["digit"]][:, 0], len(pool))]
    low, high = sides(size)
    side = low + pick(u[:, COLUMNS["side"]][:, 0], high - low + 1)
    top = pick(u[:, COLUMNS["top"]][:, 0], size - side + 1)
    left = pick(u[:, COLUMNS["left"]][:, 0], size - side + 1)
    candidates = u[:, COLUMNS["colour"]].reshape(n, TRIES, 3)
    far = ((candidates - back.mean((2, 3))[:, None]) ** 2).sum(-1).argmax(1)
    colour = candidates[np.arange(n), far]
    alpha = np.zeros((n, 1, size, size))
    for s in np.unique(side):
        chosen = np.flatnonzero(side == s)
        for i, grown in zip(chosen, alpha_of(images[digit[chosen]], int(s))):
            alpha[i, 0, top[i] : top[i] + s, left[i] : left[i] + s] = grown
    image = alpha * colour[:, :, None, None] + (1 - alpha) * back
    return (
        image,
        alpha[:, 0] > 0.5,
        dict(digit=digit, label=labels[digit], side=side, top=top, left=left, colour=colour, background=kinds),
    )


def _uniforms(split_seed: int, split: str, count: int, start: int = 0) -> np.ndarray:
    """Images ``start .. start + count``'s uniform numbers ``(count, DRAWS)`` from the split's stream."""
    return generated.uniforms(split_seed, SPLITS.index(split), count, DRAWS, start)


def paste(split_seed: int, split: str, index: int, size: int = SIZE) -> Pasted:
    """Image ``index`` of ``split`` (``"train"`` or ``"test"``) of the set made with ``split_seed`` at side
    ``size``, made on its own: the same as the loaded set's (before standardization)."""
    images, labels = _digits()
    image, mask, drawn = _make(
        _uniforms(split_seed, split, 1, index), size, images, labels, _pools(labels, split_seed)[SPLITS.index(split)]
    )
    one = {k: v[0] for k, v in drawn.items()}
    return Pasted(
        image[0],
        mask[0],
        int(one["digit"]),
        int(one["label"]),
        int(one["side"]),
        int(one["top"]),
        int(one["left"]),
        tuple(float(c) for c in one["colour"]),
        one["background"],
    )


def cache_file(split_seed: int, size: int, split: str, count: int):
    """Where a made split is kept (:data:`CACHE_FROM`; :func:`.generated.cache_file`)."""
    return generated.cache_file(NAME, CACHE_VERSION, split_seed, size, split, count)


def load_pasted_digits(
    *,
    image_size: int | None = None,
    split_seed: int = 0,
    train_count: int = 4000,
    test_count: int = 1000,
    memory_limit: str | float | None = None,
) -> Data:
    """``train_count`` / ``test_count`` images of scikit-learn's digits pasted on textured backgrounds, with
    their masks (see the module docstring); every image is fixed by ``split_seed`` (never the run's seed). A set
    of :data:`CACHE_FROM` images or more is kept once made (:func:`cache_file`) and read back, checked, after."""
    size = SIZE if image_size is None else image_size
    check_size(size, NAME)
    if size < SMALLEST:
        raise DataError(
            f"{NAME}: image_size must be at least {SMALLEST} (a digit of {FEWEST} pixels or more on "
            f"its background); got {size}"
        )
    generated.check_counts(NAME, MAX_COUNT, train_count=train_count, test_count=test_count)
    total = train_count + test_count
    # alive at once at the peak: every image as float32 and its mask, and one chunk's float64 images,
    # backgrounds, textures and alphas while it is made
    needed = (
        total * size * size * (3 * 4 + 1) + min(generated.CHUNK, max(train_count, test_count)) * 3 * size * size * 8 * 6
    )
    check_memory(
        needed,
        f"{NAME}: {total:,} images of 3x{size}x{size}",
        resolve_limit(memory_limit),
        "give a smaller --image-size",
    )
    images, labels = _digits()
    pools = _pools(labels, split_seed)

    def make(split: str, count: int) -> generated.Split:
        pool = pools[SPLITS.index(split)]
        return generated.generate(
            NAME,
            split,
            count,
            size,
            lambda start, n: _make(_uniforms(split_seed, split, n, start), size, images, labels, pool),
        )

    splits = generated.load_splits(
        NAME, CACHE_VERSION, split_seed, size, (train_count, test_count), 10, make, CACHE_FROM
    )
    return generated.labeled_data(NAME, splits, size, [str(digit) for digit in range(10)])
