"""What the sets generated image by image from a split seed share (``pasted-digits``, ``shapes``).

Such a set draws every image from uniform numbers of its own: stream ``k`` of a set is PCG64 seeded with
``[split_seed, k]`` (``k`` = 0 for the train split, 1 for the test split; a set may use further streams for what
its splits share), and image ``i`` takes the ``draws`` numbers ``i * draws ..`` of its split's stream
(:func:`uniforms`), so an image depends neither on the run's seed nor on how many images are made, and one image
can be made again on its own. This module lays the numbers out (:func:`columns`), makes a split a chunk at a time
(:func:`generate`), keeps a large set once made (:func:`cache_file`, :func:`load_splits`), and standardizes the
images into a :class:`~..record.Data` whose splits carry their masks (:func:`labeled_data`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ...errors import DataError
from ..common import channel_stats
from ..record import Data, Tensors
from ..set_registry import LABELED_IMAGES

__all__ = ["SPLITS", "cache_file", "check_counts", "columns", "generate", "labeled_data", "load_splits", "uniforms"]

SPLITS = ("train", "test")
CHUNK = 1024  # images made at once

Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # images (float32 in [0, 1]), labels, masks
Maker = Callable[[int, int], tuple[np.ndarray, np.ndarray, dict]]  # (start, count) -> images, masks, what was drawn


def columns(widths: Sequence[tuple[str, int]]) -> dict[str, slice]:
    """Which of an image's uniform numbers draws what: ``(name, width)`` pairs laid end to end."""
    out, start = {}, 0
    for name, width in widths:
        out[name] = slice(start, start + width)
        start += width
    return out


def uniforms(split_seed: int, stream: int, count: int, draws: int, start: int = 0) -> np.ndarray:
    """Numbers ``start * draws ..`` of stream ``stream`` (:data:`SPLITS`' index for a split), ``(count, draws)``:
    the uniform numbers of images ``start .. start + count``."""
    generator = np.random.PCG64([split_seed, stream])
    generator.advance(start * draws)  # one 64-bit draw per number
    return np.random.Generator(generator).random((count, draws))


def check_counts(name: str, largest: int, **counts: int) -> None:
    """Refuse a count (``train_count=...``) that is not a whole number in [1, ``largest``]."""
    for what, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= largest:
            raise DataError(f"{name}: {what} must be a whole number in [1, {largest:,}]; got {count!r}")


def generate(name: str, split: str, count: int, size: int, make: Maker, chunk: int = CHUNK) -> Split:
    """The ``count`` images of ``split`` (float32 in [0, 1]), their labels and masks, ``make(start, n)`` drawing
    ``chunk`` images at a time (the same images, less memory), with a progress bar on a terminal when there are
    many. ``make`` returns the images ``(n, 3, size, size)``, their masks ``(n, size, size)`` and what was drawn,
    its ``"label"`` the labels."""
    from tqdm import tqdm

    inputs, masks = torch.empty(count, 3, size, size), torch.empty(count, size, size, dtype=torch.bool)
    targets = torch.empty(count, dtype=torch.int64)
    with tqdm(
        total=count,
        desc=f"{name}: making the {split} images",
        unit="image",
        leave=False,
        disable=None if count > 4 * chunk else True,
    ) as bar:
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            image, mask, drawn = make(start, n)
            inputs[start : start + n] = torch.from_numpy(image)
            masks[start : start + n] = torch.from_numpy(mask)
            targets[start : start + n] = torch.from_numpy(np.asarray(drawn["label"]))
            bar.update(n)
    return inputs, targets, masks


def cache_file(name: str, version: int, split_seed: int, size: int, split: str, count: int) -> Path:
    """Where a made split is kept: in the data sets' cache folder (:func:`crate_compose.data.common.data_home`),
    named by everything that fixes its images (``version`` is raised whenever the drawing changes an image)."""
    from ..common import data_home

    return data_home() / f"{name}-v{version}-{split_seed}-{size}-{split}-{count}.safetensors"


def read_cache(name: str, path: Path, count: int, size: int, classes: int) -> Split | None:
    """A split kept at ``path``, checked whole (its tensors, shapes, dtypes, labels and pixel range); None when
    there is none. A damaged one is said and made again (it is this package's own, made from the seed)."""
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    expected = {
        "inputs": ((count, 3, size, size), torch.float32),
        "targets": ((count,), torch.int64),
        "masks": ((count, size, size), torch.bool),
    }
    try:
        found = load_file(str(path))
        problem = next(
            (
                f"{key}: {tuple(found[key].shape) if key in found else 'missing'}"
                for key, (shape, dtype) in expected.items()
                if key not in found or tuple(found[key].shape) != shape or found[key].dtype != dtype
            ),
            None,
        )
        if problem is None and not (
            0 <= int(found["targets"].min())
            and int(found["targets"].max()) < classes
            and bool(((found["inputs"] >= 0) & (found["inputs"] <= 1)).all())
        ):
            problem = "labels or pixels out of range"
    except Exception as error:  # safetensors' own errors: a truncated or foreign file
        problem = f"not a safetensors file ({' '.join(str(error).split())[:80]})"
    if problem is not None:
        print(f"note: {path} does not hold the {name} images it is named for ({problem}); made again", file=sys.stderr)
        return None
    return found["inputs"], found["targets"], found["masks"]


def _write_cache(name: str, path: Path, split: Split) -> None:
    """Keep a made split (atomically); a cache folder that cannot take it only costs the time to make it again."""
    from ...files import save_tensors

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_tensors(dict(zip(("inputs", "targets", "masks"), split)), path)
    except OSError as error:
        print(
            f"note: the {name} images are not kept in {path.parent} ({error.strerror or error}); they are made "
            "again at the next start",
            file=sys.stderr,
        )


def load_splits(
    name: str,
    version: int,
    split_seed: int,
    size: int,
    counts: Sequence[int],
    classes: int,
    make: Callable[[str, int], Split],
    cache_from: int,
) -> list[Split]:
    """Each of :data:`SPLITS`' ``counts`` images, made by ``make(split, count)``; when there are ``cache_from`` or
    more in all, each split is kept once made (:func:`cache_file`) and read back, checked, after."""
    cached = sum(counts) >= cache_from
    splits = []
    for split, count in zip(SPLITS, counts):
        path = cache_file(name, version, split_seed, size, split, count)
        found = read_cache(name, path, count, size, classes) if cached else None
        if found is None:
            found = make(split, count)
            if cached:
                _write_cache(name, path, found)
        splits.append(found)
    return splits


def labeled_data(name: str, splits: Sequence[Split], size: int, class_names: Sequence[str]) -> Data:
    """The labeled RGB images of ``splits`` (train, test) standardized per channel with the train split's mean and
    std (in place), each split with its masks."""
    mean, std = channel_stats(splits[0][0])
    for inputs, _, _ in splits:
        inputs.sub_(mean.view(1, -1, 1, 1)).div_(std.view(1, -1, 1, 1))
    train, test = (Tensors(x, y, masks=m) for x, y, m in splits)
    classes = len(class_names)
    return Data(
        name=name,
        train=train,
        test=test,
        input_shape=(3, size, size),
        classes=classes,
        provides=LABELED_IMAGES,
        mean=tuple(mean.tolist()),
        std=tuple(std.tolist()),
        class_names=list(class_names),
        sizes={"channels": 3, "image_size": size, "classes": classes},
    )
