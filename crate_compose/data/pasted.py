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
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..memory import resolve_limit
from ..errors import DataError
from .folders import check_memory, stratified_split
from .record import Data, Tensors, check_size
from .set_registry import LABELED_IMAGES
from .shipped import channel_stats

__all__ = ["Pasted", "load_pasted_digits", "paste"]

NAME = "pasted-digits"
SIZE, SMALLEST = 32, 8  # the default image side, and the smallest one
SIDES, FEWEST = (10 / 32, 24 / 32), 5  # the pasted digit's side as a share of the image's, and its fewest pixels
SPLITS = ("train", "test")
BACKGROUNDS = ("noise", "stripes", "checks", "mix")
TEXTURES = BACKGROUNDS[:3]  # what a mix mixes
CELLS, TRIES = (2, 5), 8  # a noise grid's sides; the digit's colour: the farthest of this many from the background's
MAX_COUNT = 1_000_000
CHUNK = 1024  # images made at once
CACHE_FROM = 10_000  # images (train and test) from which a made set is kept in the cache folder: pasted-digits:40000
# takes 30-90 s to make, and every run start, probe and segment of such a run would make it again
CACHE_VERSION = 1  # in the cached files' names: raised whenever the drawing changes what an image is


def _columns() -> dict[str, slice]:
    """Which of an image's uniform numbers draws what."""
    widths = [("kind", 1), ("weight", 1), ("textures", 2)]
    for part in (0, 1):  # the two textures of a mix (a background that is not a mix uses the first)
        widths += [(f"{part}.cells", 1), (f"{part}.grid", CELLS[1] ** 2 * 3), (f"{part}.angle", 1),
                   (f"{part}.periods", 1), (f"{part}.phase", 2), (f"{part}.softness", 1), (f"{part}.colours", 6)]
    widths += [("digit", 1), ("side", 1), ("top", 1), ("left", 1), ("colour", TRIES * 3)]
    columns, start = {}, 0
    for name, width in widths:
        columns[name] = slice(start, start + width)
        start += width
    return columns


COLUMNS = _columns()
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
    grown = torch.nn.functional.interpolate(torch.as_tensor(digits, dtype=torch.float64)[:, None],
                                            size=(side, side), mode="bilinear", align_corners=False)
    return grown[:, 0].clamp(0, 1).numpy()


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def _pools(labels: np.ndarray, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits each split draws its objects from: the ``digits`` set's own stratified split."""
    return stratified_split(labels, 0.2, split_seed, NAME)


def _uniforms(split_seed: int, split: str, count: int, start: int = 0) -> np.ndarray:
    """Images ``start .. start + count``'s uniform numbers ``(count, DRAWS)`` from the split's stream."""
    stream = np.random.PCG64([split_seed, SPLITS.index(split)])
    stream.advance(start * DRAWS)  # one 64-bit draw per number
    return np.random.Generator(stream).random((count, DRAWS))


def _pick(u: np.ndarray, count: int) -> np.ndarray:
    """Whole numbers in [0, count) from uniform numbers."""
    return np.minimum((u * count).astype(np.int64), count - 1)


def _linear(cells: int, size: int) -> np.ndarray:
    """``(size, cells)``: linear interpolation from ``cells`` samples to ``size`` (the end samples on the ends,
    as bilinear resizing with the corners aligned)."""
    place = np.arange(size) * (cells - 1) / (size - 1)
    low = np.minimum(place.astype(np.int64), cells - 2)
    weights = np.zeros((size, cells))
    weights[np.arange(size), low] = 1 - (place - low)
    weights[np.arange(size), low + 1] = place - low
    return weights


def _texture(u: np.ndarray, part: int, kinds: np.ndarray, size: int) -> np.ndarray:
    """Texture ``part`` of every image ``(n, 3, size, size)``: smooth noise, stripes or checks (``kinds``
    indexes :data:`TEXTURES`)."""
    column = {name.split(".", 1)[1]: u[:, s] for name, s in COLUMNS.items() if name.startswith(f"{part}.")}
    out = np.empty((len(u), 3, size, size))
    cells = CELLS[0] + _pick(column["cells"][:, 0], CELLS[1] - CELLS[0] + 1)
    for side in np.unique(cells[kinds == 0]):
        chosen = (kinds == 0) & (cells == side)
        grid = column["grid"][chosen].reshape(-1, 3, CELLS[1], CELLS[1])[..., :side, :side]
        spread = _linear(int(side), size)
        out[chosen] = spread @ grid @ spread.T
    waves = kinds > 0
    if waves.any():
        angle = math.pi * column["angle"][waves, 0, None, None]
        periods = 2 * math.pi * (1.5 + 4.5 * column["periods"][waves, 0, None, None]) / size
        phase = 2 * math.pi * column["phase"][waves][:, :, None, None]
        softness = 0.5 + 3.5 * column["softness"][waves, 0, None, None]
        y, x = np.mgrid[0:size, 0:size]
        wave = np.sin(periods * (x * np.cos(angle) + y * np.sin(angle)) + phase[:, 0])
        checks = kinds[waves] == 2
        wave[checks] *= np.sin(periods[checks] * (y * np.cos(angle[checks]) - x * np.sin(angle[checks]))
                               + phase[checks, 1])
        share = (0.5 + 0.5 * np.tanh(softness * wave) / np.tanh(softness))[:, None]
        colours = column["colours"][waves]
        out[waves] = colours[:, :3, None, None] * share + colours[:, 3:, None, None] * (1 - share)
    return out


def _make(u: np.ndarray, size: int, images: np.ndarray, labels: np.ndarray, pool: np.ndarray):
    """The images ``(n, 3, size, size)`` in [0, 1], their masks ``(n, size, size)`` and what was drawn, from
    their uniform numbers ``(n, DRAWS)``."""
    n = len(u)
    kind = _pick(u[:, COLUMNS["kind"]][:, 0], len(BACKGROUNDS))
    mixed = kind == BACKGROUNDS.index("mix")
    textures = _pick(u[:, COLUMNS["textures"]], len(TEXTURES))
    first = np.where(mixed, textures[:, 0], np.minimum(kind, len(TEXTURES) - 1))
    weight = np.where(mixed, 0.3 + 0.4 * u[:, COLUMNS["weight"]][:, 0], 1.0)[:, None, None, None]
    back = weight * _texture(u, 0, first, size)
    if mixed.any():
        back[mixed] += (1 - weight[mixed]) * _texture(u[mixed], 1, textures[mixed, 1], size)
    digit = pool[_pick(u[:, COLUMNS["digit"]][:, 0], len(pool))]
    low, high = sides(size)
    side = low + _pick(u[:, COLUMNS["side"]][:, 0], high - low + 1)
    top = _pick(u[:, COLUMNS["top"]][:, 0], size - side + 1)
    left = _pick(u[:, COLUMNS["left"]][:, 0], size - side + 1)
    candidates = u[:, COLUMNS["colour"]].reshape(n, TRIES, 3)
    far = ((candidates - back.mean((2, 3))[:, None]) ** 2).sum(-1).argmax(1)
    colour = candidates[np.arange(n), far]
    alpha = np.zeros((n, 1, size, size))
    for s in np.unique(side):
        chosen = np.flatnonzero(side == s)
        for i, grown in zip(chosen, alpha_of(images[digit[chosen]], int(s))):
            alpha[i, 0, top[i]:top[i] + s, left[i]:left[i] + s] = grown
    image = alpha * colour[:, :, None, None] + (1 - alpha) * back
    kinds = [f"mix of {TEXTURES[a]} and {TEXTURES[b]}" if m else TEXTURES[a]
             for m, a, b in zip(mixed, first, textures[:, 1])]
    return image, alpha[:, 0] > 0.5, dict(digit=digit, label=labels[digit], side=side, top=top, left=left,
                                          colour=colour, background=kinds)


def paste(split_seed: int, split: str, index: int, size: int = SIZE) -> Pasted:
    """Image ``index`` of ``split`` (``"train"`` or ``"test"``) of the set made with ``split_seed`` at side
    ``size``, made on its own: the same as the loaded set's (before standardization)."""
    images, labels = _digits()
    image, mask, drawn = _make(_uniforms(split_seed, split, 1, index), size, images, labels,
                               _pools(labels, split_seed)[SPLITS.index(split)])
    one = {k: v[0] for k, v in drawn.items()}
    return Pasted(image[0], mask[0], int(one["digit"]), int(one["label"]), int(one["side"]), int(one["top"]),
                  int(one["left"]), tuple(float(c) for c in one["colour"]), one["background"])


def _generate(split_seed: int, split: str, count: int, size: int, images: np.ndarray, labels: np.ndarray,
              pool: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``count`` images of ``split`` (float32 in [0, 1]), their labels and masks, drawn a chunk at a time (the
    same images, less memory), with a progress bar on a terminal when there are many."""
    from tqdm import tqdm

    inputs, masks = torch.empty(count, 3, size, size), torch.empty(count, size, size, dtype=torch.bool)
    targets = torch.empty(count, dtype=torch.int64)
    with tqdm(total=count, desc=f"{NAME}: making the {split} images", unit="image", leave=False,
              disable=None if count > 4 * CHUNK else True) as bar:
        for start in range(0, count, CHUNK):
            chunk = min(CHUNK, count - start)
            image, mask, drawn = _make(_uniforms(split_seed, split, chunk, start), size, images, labels, pool)
            inputs[start:start + chunk] = torch.from_numpy(image)
            masks[start:start + chunk] = torch.from_numpy(mask)
            targets[start:start + chunk] = torch.from_numpy(drawn["label"])
            bar.update(chunk)
    return inputs, targets, masks


def cache_file(split_seed: int, size: int, split: str, count: int) -> Path:
    """Where a made split is kept (:data:`CACHE_FROM`): in the data sets' cache folder
    (:func:`crate_compose.data.archives.data_home`), named by everything that fixes its images."""
    from .archives import data_home

    return data_home() / f"{NAME}-v{CACHE_VERSION}-{split_seed}-{size}-{split}-{count}.safetensors"


def _read_cache(path: Path, count: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A split kept at ``path``, checked whole (its tensors, shapes, dtypes, labels and pixel range); None when
    there is none. A damaged one is said and made again (it is this package's own, made from the seed)."""
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    expected = {"inputs": ((count, 3, size, size), torch.float32), "targets": ((count,), torch.int64),
                "masks": ((count, size, size), torch.bool)}
    try:
        found = load_file(str(path))
        problem = next((f"{key}: {tuple(found[key].shape) if key in found else 'missing'}"
                        for key, (shape, dtype) in expected.items()
                        if key not in found or tuple(found[key].shape) != shape or found[key].dtype != dtype), None)
        if problem is None and not (0 <= int(found["targets"].min()) and int(found["targets"].max()) < 10
                                    and bool(((found["inputs"] >= 0) & (found["inputs"] <= 1)).all())):
            problem = "labels or pixels out of range"
    except Exception as error:  # safetensors' own errors: a truncated or foreign file
        problem = f"not a safetensors file ({' '.join(str(error).split())[:80]})"
    if problem is not None:
        print(f"note: {path} does not hold the {NAME} images it is named for ({problem}); made again",
              file=sys.stderr)
        return None
    return found["inputs"], found["targets"], found["masks"]


def _write_cache(path: Path, inputs: torch.Tensor, targets: torch.Tensor, masks: torch.Tensor) -> None:
    """Keep a made split (atomically); a cache folder that cannot take it only costs the time to make it again."""
    from ..files import save_tensors

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_tensors({"inputs": inputs, "targets": targets, "masks": masks}, path)
    except OSError as error:
        print(f"note: the {NAME} images are not kept in {path.parent} ({error.strerror or error}); they are made "
              "again at the next start", file=sys.stderr)


def load_pasted_digits(*, image_size: int | None = None, split_seed: int = 0, train_count: int = 4000,
                       test_count: int = 1000, memory_limit: str | float | None = None) -> Data:
    """``train_count`` / ``test_count`` images of scikit-learn's digits pasted on textured backgrounds, with
    their masks (see the module docstring); every image is fixed by ``split_seed`` (never the run's seed). A set
    of :data:`CACHE_FROM` images or more is kept once made (:func:`cache_file`) and read back, checked, after."""
    size = SIZE if image_size is None else image_size
    check_size(size, NAME)
    if size < SMALLEST:
        raise DataError(f"{NAME}: image_size must be at least {SMALLEST} (a digit of {FEWEST} pixels or more on "
                        f"its background); got {size}")
    for what, count in (("train_count", train_count), ("test_count", test_count)):
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise DataError(f"{NAME}: {what} must be a whole number in [1, {MAX_COUNT:,}]; got {count!r}")
    total = train_count + test_count
    # alive at once at the peak: every image as float32 and its mask, and one chunk's float64 images,
    # backgrounds, textures and alphas while it is made
    needed = total * size * size * (3 * 4 + 1) + min(CHUNK, max(train_count, test_count)) * 3 * size * size * 8 * 6
    check_memory(needed, f"{NAME}: {total:,} images of 3x{size}x{size}", resolve_limit(memory_limit),
                 "give a smaller --image-size")
    images, labels = _digits()
    pools = _pools(labels, split_seed)
    splits = []
    cached = total >= CACHE_FROM
    for split, count, pool in zip(SPLITS, (train_count, test_count), pools):
        path = cache_file(split_seed, size, split, count)
        found = _read_cache(path, count, size) if cached else None
        if found is None:
            found = _generate(split_seed, split, count, size, images, labels, pool)
            if cached:
                _write_cache(path, *found)
        splits.append(found)
    mean, std = channel_stats(splits[0][0])
    for inputs, _, _ in splits:  # standardized in place
        inputs.sub_(mean.view(1, -1, 1, 1)).div_(std.view(1, -1, 1, 1))
    train, test = (Tensors(x, y, masks=m) for x, y, m in splits)
    return Data(
        name=NAME,
        train=train,
        test=test,
        input_shape=(3, size, size),
        classes=10,
        provides=LABELED_IMAGES,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        class_names=[str(digit) for digit in range(10)],
        sizes={"channels": 3, "image_size": size, "classes": 10},
    )
