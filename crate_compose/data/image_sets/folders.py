"""Images read from a folder the user already has: each file checked before it is decoded, class
folders scanned, a fixed split.

The layout is torchvision's ImageFolder: PATH/<class>/<image> (e.g. CIFAR-10 or ImageNet written
out as files). Class folders are sorted (hidden ones are skipped); files ending in .png .jpg .jpeg
.bmp .gif .webp .ppm (any case) are images, and anything else named so (a FIFO, a dangling link) is
refused. If PATH/train and PATH/test (or PATH/val) exist they are the split (a test class must be a
train class), else a stratified 80/20 split fixed by ``split_seed``.

Reading is safe: Pillow reads a file's header when it opens it, and the header is checked before
anything is decoded. An image whose decoding would go over the memory limit, or that has more pixels
than Pillow's decompression-bomb threshold (a PNG of a few kB can hold 13000x13000 pixels), is
refused naming the file and its size; a file that is not an image, or is truncated, is named too.
Images are read lazily (:class:`FolderImages`, on access), converted to RGB, resized (bilinear) and
standardized per channel with statistics estimated on up to 512 train images, read one at a time.

:func:`read_folder` gives the class names and both splits; :func:`load_folder` makes them the
``folder:PATH`` data set.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import DataError
from ...memory import resolve_limit
from ..common import Limit, check_memory, stratified_split
from ..record import Data, check_size
from ..set_registry import LABELED_IMAGES

__all__ = ["FolderImages", "image_header", "load_folder", "read_folder", "read_image", "read_rgb", "scan_classes"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm")
STATS_SAMPLE = 512  # images read to estimate a folder's channel statistics

# ---------------------------------------------------------------- reading a file


def read_image(path: Path, size: tuple[int, int] | None = None, limit: Limit = (None, "")) -> torch.Tensor:
    """An image file as a (3, H, W) float32 tensor in [0, 1], resized (bilinear) to ``size`` = (H, W).
    Its header is checked before it is decoded (:func:`_check_header`): an image that would not fit
    in ``limit``, or a decompression bomb, is refused without being decoded."""
    from PIL import Image

    with _opened(path, size, limit) as opened:
        image = opened.convert("RGB")
        if size is not None and image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), Image.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255.0


def read_rgb(path: Path, size: tuple[int, int] | None = None, limit: Limit = (None, "")) -> Any:
    """An image file as an RGB Pillow image at its own size, for transforms that crop it before it is
    resized (:mod:`crate_compose.data.batches`); checked as :func:`read_image` checks it for ``size``."""
    with _opened(path, size, limit) as opened:
        image = opened.convert("RGB")
        image.load()
    return image


def image_header(path: Path, size: tuple[int, int] | None = None, limit: Limit = (None, "")) -> tuple[int, int]:
    """(H, W) of an image file from its header alone, checked as :func:`read_image` checks it (to be
    resized to ``size``, within ``limit``); nothing is decoded."""
    with _opened(path, size, limit) as opened:
        width, height = opened.size
    return height, width


@contextlib.contextmanager
def _opened(path: Path, size: tuple[int, int] | None, limit: Limit) -> Iterator[Any]:
    """``path`` opened with Pillow, which reads the header only, and checked (:func:`_check_header`)
    before the block decodes it. Whatever goes wrong while it is read is a :class:`DataError` naming
    the file: Pillow's decompression-bomb error and warning, a file that is not an image, a truncated one."""
    from PIL import Image

    try:
        with warnings.catch_warnings():  # the threshold is checked with the file and its size named
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(path)
        with opened:
            _check_header(path, opened.size, opened.mode, size, limit)
            yield opened
    except DataError:
        raise
    except Image.DecompressionBombError as error:  # twice the threshold: Pillow refuses it itself
        raise DataError(f"{path}: refused as a decompression bomb: {error}") from None
    except (OSError, ValueError, SyntaxError, MemoryError) as error:
        raise DataError(f"{path}: cannot read the image ({error})") from None


DECODED_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}  # else 4 (RGB is RGBX)
RESIZED_BYTES = 40  # per output pixel: RGBX, its array, a copy, float32 and the scaled float32 (3 + 3 + 3 + 12 + 12)


def _check_header(path: Path, pixels: tuple[int, int], mode: str, size: tuple[int, int] | None, limit: Limit) -> None:
    """Refuse an image from its header (``pixels`` = (W, H), Pillow's ``mode``) before it is decoded:
    when decoding it (in its own mode, then as RGB, which Pillow keeps in 4 bytes a pixel) and making
    the float32 tensor of ``size`` = (H, W) (its own size when None) would go over the memory
    ``limit``, or when it has more pixels than Pillow's decompression-bomb threshold
    (``PIL.Image.MAX_IMAGE_PIXELS``: a PNG of 48 kB can hold 13000x13000 pixels, 1.6 GB decoded)."""
    from PIL import Image

    width, height = pixels
    out = size or (height, width)
    needed = float(width) * height * (DECODED_BYTES.get(mode, 4) + 4) + float(out[0]) * out[1] * RESIZED_BYTES
    check_memory(needed, f"{path}: {width}x{height} pixels", limit, "make the image smaller", held="decoded")
    bomb = Image.MAX_IMAGE_PIXELS
    if bomb is not None and width * height > bomb:
        raise DataError(
            f"{path}: {width}x{height} pixels ({width * height:,}) is over Pillow's decompression-bomb "
            f"limit of {bomb:,} pixels; it is not decoded (make the image smaller)"
        )


# ---------------------------------------------------------------- a split read on access


class FolderImages(Dataset):
    """Image files read on access: RGB, resized to ``size`` (H, W), standardized per channel. Every
    read checks the file's header against ``limit`` (the memory limit, :func:`read_image`) first."""

    def __init__(self, files: list[Path], labels: list[int], size: tuple[int, int], limit: Limit = (None, "")):
        self.files, self.labels, self.size, self.limit = files, labels, size, limit
        self.mean = torch.zeros(3)
        self.std = torch.ones(3)

    def __len__(self) -> int:
        return len(self.files)

    def raw(self, index: int) -> torch.Tensor:
        """Image ``index`` as a (3, H, W) float tensor in [0, 1], resized, not standardized."""
        return read_image(self.files[index], self.size, self.limit)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.raw(index)
        return (image - self.mean.view(3, 1, 1)) / self.std.view(3, 1, 1), self.labels[index]


def _streamed_stats(split: FolderImages, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (floored away from zero) of the images ``indices`` of ``split``, read
    one at a time (sums in float64), so that the sample never lies in memory at once."""
    total, squares, count = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 0
    for index in indices:
        pixels = split.raw(index).double().reshape(3, -1)
        total += pixels.sum(1)
        squares += pixels.square().sum(1)
        count += pixels.shape[1]
    mean = total / count
    variance = (squares - count * mean.square()) / max(count - 1, 1)
    return mean.float(), variance.clamp_min(0).sqrt().clamp_min(1e-6).float()


# ---------------------------------------------------------------- class folders and splits


def scan_classes(root: Path) -> tuple[list[str], list[list[Path]]]:
    """Sorted class folders of ``root`` and the sorted image files of each."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder")
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders (expected {root}/<class>/<image files>)")
    files = []
    for name in classes:
        images = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        odd = next((f for f in images if not f.is_file()), None)
        if odd is not None:  # a FIFO, a socket or a dangling link named like an image: never skipped silently
            raise DataError(f"{odd}: not a regular file (an image file is expected here)")
        if not images:
            raise DataError(f"{root / name}: a class folder without images ({', '.join(IMAGE_SUFFIXES)})")
        files.append(images)
    return classes, files


Files = tuple[list[Path], list[int]]  # image files and their class indices


def _flatten(files: list[list[Path]], index: dict[str, int], classes: list[str]) -> Files:
    """One list of files and one of labels from per-class lists."""
    paths = [path for group in files for path in group]
    labels = [index[name] for name, group in zip(classes, files) for _ in group]
    return paths, labels


def _folder_splits(root: Path, split_seed: int) -> tuple[list[str], Files, Files]:
    """Class names and (files, labels) of train and test: PATH/train + PATH/test|val, else 80/20."""
    held_out = next((root / name for name in ("test", "val") if (root / name).is_dir()), None)
    if (root / "train").is_dir() and held_out is not None:
        classes, train_files = scan_classes(root / "train")
        test_classes, test_files = scan_classes(held_out)
        unknown = sorted(set(test_classes) - set(classes))
        if unknown:
            raise DataError(f"{held_out}: classes not in {root / 'train'}: {', '.join(unknown)}")
        index = {name: i for i, name in enumerate(classes)}
        return classes, _flatten(train_files, index, classes), _flatten(test_files, index, test_classes)
    classes, files = scan_classes(root)
    paths, labels = _flatten(files, {name: i for i, name in enumerate(classes)}, classes)
    train, test = stratified_split(labels, 0.2, split_seed, str(root))
    pick = lambda rows: ([paths[i] for i in rows], [labels[i] for i in rows])  # noqa: E731
    return classes, pick(train), pick(test)


def _common_size(root: Path, files: list[Path], limit: Limit) -> tuple[int, int]:
    """The (H, W) every image shares (read from headers, each checked against ``limit``), else a
    DataError asking for image_size."""
    first = image_header(files[0], None, limit)
    for path in files[1:]:
        if image_header(path, None, limit) != first:
            raise DataError(
                f"{root}: images differ in size ({files[0].name} is {first[1]}x{first[0]}, {path.name} is not); "
                "give image_size to resize them"
            )
    return first


def read_folder(
    root: Path, image_size: int | None, split_seed: int, limit: Limit
) -> tuple[list[str], FolderImages, FolderImages]:
    """The class names of the folder ``root`` and its train and test splits, read lazily, resized to
    ``image_size`` (default: the size every image shares, from their headers) and standardized with
    the channel statistics of up to :data:`STATS_SAMPLE` train images (a sample fixed by
    ``split_seed``, as is the 80/20 split). Every image is checked against ``limit`` before it is decoded."""
    classes, (train_files, train_labels), (test_files, test_labels) = _folder_splits(root, split_seed)
    size = (image_size, image_size) if image_size else _common_size(root, train_files + test_files, limit)
    train = FolderImages(train_files, train_labels, size, limit)
    test = FolderImages(test_files, test_labels, size, limit)
    generator = torch.Generator().manual_seed(split_seed)
    sample = torch.randperm(len(train), generator=generator)[:STATS_SAMPLE].tolist()
    mean, std = _streamed_stats(train, sample)
    for split in (train, test):
        split.mean, split.std = mean, std
    return classes, train, test


# ---------------------------------------------------------------- folder


def load_folder(
    path: str | Path, *, image_size: int | None = None, split_seed: int = 0, memory_limit: str | float | None = None
) -> Data:
    """Images in class folders (PATH/<class>/<file>), read lazily: the ``folder:PATH`` data set; see the
    module docstring.

    Deterministic: the 80/20 split (when there is no train/test layout) and the images sampled for
    the channel statistics depend on ``split_seed`` only. Every image is checked from its header
    before it is decoded, against ``memory_limit`` (:func:`crate_compose.memory.resolve_limit`) and
    Pillow's decompression-bomb threshold (:func:`read_image`); :func:`~..sets.verify` checks them all.
    """
    root = Path(path).expanduser()
    check_size(image_size, str(root))
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
        provides=LABELED_IMAGES,
        mean=tuple(train.mean.tolist()),
        std=tuple(train.std.tolist()),
        class_names=classes,
        sizes=sizes,
    )
