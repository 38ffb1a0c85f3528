"""The training batches: which examples each step takes, decoded and augmented in DataLoader workers.

Step ``s`` of a run (counted from 1) takes the examples :func:`batch_indices` gives: a seeded
permutation of the training split per epoch, drop-last. Under ``torchrun`` each process takes its
share of that global batch (:meth:`crate_compose.training.distributed.Distributed.shard`).

:func:`batches` yields the batches of steps ``start + 1 .. steps`` from a
:class:`torch.utils.data.DataLoader` whose batch sampler (:class:`StepBatches`) gives exactly those
examples, each as ``(step, position in the global batch, index)``. With ``Settings.workers = 0`` the
batches are made in the training process, as before; with ``N`` they are decoded and augmented in
``N`` worker processes (persistent, :data:`PREFETCH` batches ahead each, pinned memory on CUDA).

Every random draw of an augmentation is a function of the run's seed and the step alone, never of
the process that makes it:

* ``crop-flip`` and ``randaugment`` transform each example with the global torch generator seeded
  by ``step_seed(seed, "example/<step>/<position>")`` (forked, so the training process's own state
  is left as it was);
* ``shift`` draws a batch's offsets from a generator seeded by ``"augment/<step>/<rank>"``;
* ``mixup`` / ``cutmix`` mix a process's batch with draws seeded by ``"mix/<step>/<rank>"``.

So the same step gives the same batch with 0 or N workers and after ``--resume``
(``tests/test_loading.py``).

The transforms are torchvision's (:func:`transforms_v2`), applied to the image before it is
standardized: ``crop-flip`` is ``RandomResizedCrop(scale=(0.08, 1))`` to the input size and
``RandomHorizontalFlip`` (the CRATE / DeiT pre-training recipe); ``randaugment`` adds
``RandAugment(num_ops=2, magnitude=14)`` on uint8 pixels (the CRATE fine-tuning recipe, 003 App.
B.1). Images of a ``folder:PATH`` are cropped from the decoded file at its own size (a Pillow image)
before they are resized, as the recipe does; in-memory sets (digits, photos) are un-standardized
with the statistics they were standardized with, transformed, and standardized again. The
statistics are the data's own (``normalize="data"``) or ImageNet's (``normalize="imagenet"``; the
held-out split is then standardized the same way, :func:`renormalize`). ``mixup`` and ``cutmix``
(torchvision's ``MixUp``/``CutMix``; one of the two, at even odds, per batch when both are given)
make soft targets, which the classification loss takes with label smoothing.
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import DataError, TrainError
from ..seeds import step_seed
from ..settings import Settings
from .image_sets.folders import FolderImages, read_rgb
from .sets import Data

__all__ = [
    "AUGMENTING",
    "Examples",
    "StepBatches",
    "batch_indices",
    "batch_of",
    "batches",
    "check",
    "check_normalize",
    "epoch_order",
    "held_batches",
    "is_images",
    "is_rgb",
    "loader",
    "normalization",
    "renormalize",
    "shift",
    "split_batches",
    "transforms_v2",
]

AUGMENTING = ("crop-flip", "randaugment")  # per-example transforms (torchvision), images only
CROP_SCALE = (0.08, 1.0)  # RandomResizedCrop's share of the image's area (DeiT, CRATE)
RANDAUGMENT = {"num_ops": 2, "magnitude": 14}  # CRATE's fine-tuning recipe (003 App. B.1)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PREFETCH = 2  # batches each worker prepares ahead (DataLoader's prefetch_factor)


# ---------------------------------------------------------------- which examples a step takes


def batch_indices(step: int, size: int, settings: Settings) -> torch.Tensor:
    """The examples of global batch ``step`` (from 1): a seeded permutation per epoch, drop-last."""
    epoch, position = divmod(step - 1, max(1, size // settings.batch_size))
    return epoch_order(epoch, size, settings)[position * settings.batch_size : (position + 1) * settings.batch_size]


def epoch_order(epoch: int, size: int, settings: Settings) -> torch.Tensor:
    """The order of the examples in ``epoch`` (from 0): a permutation seeded by the run's seed and the epoch."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(step_seed(settings.seed, f"epoch/{epoch}")))


def batch_of(dataset, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples ``indices`` of ``dataset`` as two stacked tensors (inputs, targets)."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[0][indices], tensors[1][indices]
    items = [dataset[int(i)] for i in indices]
    targets = [y for _, y in items]
    targets = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.as_tensor(targets)
    return torch.stack([x for x, _ in items]), targets


class StepBatches(Sampler):
    """The batches of steps ``start + 1 .. settings.steps``: this process's share of each global batch
    :func:`batch_indices` gives, every example as ``(step, position in the global batch, index)``."""

    def __init__(self, size: int, settings: Settings, start: int, rank: int = 0, world: int = 1) -> None:
        self.size, self.settings, self.start, self.rank, self.world = size, settings, start, rank, world

    def __len__(self) -> int:
        return max(0, self.settings.steps - self.start)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        batch = self.settings.batch_size
        per = batch // self.world
        first = self.rank * per
        cached, order = None, None  # one permutation per epoch (1.28M examples: 20 ms), as batch_indices draws it
        for step in range(self.start + 1, self.settings.steps + 1):
            epoch, position = divmod(step - 1, max(1, self.size // batch))
            if epoch != cached:
                cached, order = epoch, epoch_order(epoch, self.size, self.settings)
            indices = order[position * batch : (position + 1) * batch][first : first + per]
            yield [(step, first + i, index) for i, index in enumerate(indices.tolist())]


# ---------------------------------------------------------------- normalization


def normalization(data: Data, normalize: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The per-channel mean and std the model's inputs are standardized with: the data's own
    (``normalize="data"``) or ImageNet's (``"imagenet"``); None for data that is not standardized
    (text, token sets)."""
    if data.mean is None or data.std is None:
        return None
    if normalize == "imagenet":
        return torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    return torch.tensor(data.mean), torch.tensor(data.std)


def renormalize(x: torch.Tensor, data: Data, normalize: str) -> torch.Tensor:
    """Inputs of ``data`` (standardized with its own statistics) standardized as ``normalize`` says
    (unchanged with ``"data"``): how the held-out split meets a model trained with ImageNet's."""
    if normalize == "data" or data.mean is None:
        return x
    mean, std = normalization(data, normalize)
    own_mean, own_std = torch.tensor(data.mean), torch.tensor(data.std)
    shape = (1, -1, 1, 1)
    pixels = x * own_std.view(shape).to(x) + own_mean.view(shape).to(x)
    return (pixels - mean.view(shape).to(x)) / std.view(shape).to(x)


# ---------------------------------------------------------------- checks


def is_images(data: Data) -> bool:
    """Whether ``data`` is images (``(C, H, W)`` inputs standardized with its own statistics)."""
    return len(data.input_shape) == 3 and data.mean is not None


def is_rgb(data: Data) -> bool:
    return is_images(data) and data.input_shape[0] == 3


def check(settings: Settings, data: Data, mixes_labels: bool = True) -> None:
    """Refuse a data pipeline the data cannot take (before anything is written); ``mixes_labels``: whether
    the run's task takes the soft class targets of --mixup and --cutmix."""
    images = is_images(data)
    if settings.augment in AUGMENTING and not images:
        raise TrainError(f"augment '{settings.augment}' crops and flips images; data set '{data.name}' is not images")
    check_normalize(settings.normalize, data)
    for name in ("mixup", "cutmix"):
        if getattr(settings, name) and (not mixes_labels or not data.classes or not images):
            raise TrainError(
                f"--{name} mixes labeled images into soft targets: it goes with --task classify on "
                f"labeled images, not task '{settings.task}' on data set '{data.name}'"
            )


def check_normalize(normalize: str, data: Data, error: type[Exception] = TrainError) -> None:
    """Refuse ImageNet's statistics for data that is not RGB images (raising ``error``)."""
    if normalize == "imagenet" and not is_rgb(data):
        what = (
            f"has {data.input_shape[0]} channel{'s' * (data.input_shape[0] != 1)}"
            if is_images(data)
            else "is not images"
        )
        raise error(
            f"normalize 'imagenet' standardizes RGB images with ImageNet's statistics; data set '{data.name}' {what}"
        )


# ---------------------------------------------------------------- the examples of a batch


def shift(images: torch.Tensor, generator: torch.Generator, most: int = 1) -> torch.Tensor:
    """Move each image by up to ``most`` pixels in each direction, filling with 0 (the standardized mean)."""
    padded = F.pad(images, (most, most, most, most))
    h, w = images.shape[-2:]
    offsets = torch.randint(0, 2 * most + 1, (len(images), 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The global CPU generator seeded with ``seed`` inside the block (torchvision's transforms draw
    from it), and as it was after."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


@dataclass(frozen=True)
class _Failure:
    """A data error met in a worker, carried to the training process as its message."""

    message: str


class Examples(Dataset):
    """The training split of ``data`` as the batches of :class:`StepBatches`: ``__getitems__`` takes a
    batch's ``(step, position, index)`` triples and gives ``(step, inputs, targets)``, decoded,
    transformed and standardized as ``settings`` says (see the module docstring)."""

    def __init__(self, data: Data, settings: Settings, rank: int = 0) -> None:
        self.split, self.settings, self.rank = data.train, settings, rank
        self.classes = data.classes
        self.size = tuple(data.input_shape[-2:])
        self.own = (torch.tensor(data.mean), torch.tensor(data.std)) if data.mean is not None else None
        self.target = normalization(data, settings.normalize)
        self.per_example = settings.augment in AUGMENTING or settings.normalize != "data"
        self._transforms: dict[str, Any] | None = None  # built in each process on first use

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_transforms": None}  # a worker builds its own (and imports torchvision then)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``(step, position, index)``: its input as :meth:`example` makes it, and its target."""
        return self.example(*item), self._targets(torch.tensor([item[2]]))[0]

    def __getitems__(self, batch: list[tuple[int, int, int]]) -> tuple[int, torch.Tensor, torch.Tensor] | _Failure:
        try:
            return self._batch(batch)
        except DataError as error:  # named in the training process as itself, not as a worker's traceback
            return _Failure(str(error))

    def _batch(self, batch: list[tuple[int, int, int]]) -> tuple[int, torch.Tensor, torch.Tensor]:
        step, settings = batch[0][0], self.settings
        indices = torch.tensor([index for _, _, index in batch], dtype=torch.int64)
        if self.per_example:
            x = torch.stack([self.example(s, position, index) for s, position, index in batch])
            y = self._targets(indices)
        else:
            x, y = batch_of(self.split, indices)
        if settings.augment == "shift":
            x = shift(x, torch.Generator().manual_seed(step_seed(settings.seed, f"augment/{step}/{self.rank}")))
        if settings.mixup or settings.cutmix:
            with _seeded(step_seed(settings.seed, f"mix/{step}/{self.rank}")):
                x, y = self._built()["mix"](x, y)
        return step, x, y

    def _targets(self, indices: torch.Tensor) -> torch.Tensor:
        targets = getattr(self.split, "targets", None)
        if isinstance(targets, torch.Tensor):
            return targets[indices]
        return torch.as_tensor([self.split.labels[i] for i in indices.tolist()], dtype=torch.int64)

    def example(self, step: int, position: int, index: int) -> torch.Tensor:
        """Example ``index`` as the ``position``-th input of global batch ``step``: transformed with
        draws seeded by (run seed, step, position), standardized."""
        if self.settings.augment not in AUGMENTING:
            pixels = self._pixels(index)
        elif isinstance(self.split, FolderImages):  # cropped from the file at its own size, then resized
            image = read_rgb(self.split.files[index], self.split.size, self.split.limit)
            with _seeded(step_seed(self.settings.seed, f"example/{step}/{position}")):
                image = self._built()["pil"](image)
            pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0
        else:
            pixels = self._pixels(index)
            with _seeded(step_seed(self.settings.seed, f"example/{step}/{position}")):
                pixels = self._built()["tensor"](pixels)
        mean, std = self.target
        return (pixels - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)

    def _pixels(self, index: int) -> torch.Tensor:
        """Example ``index`` as stored, un-standardized: pixels in [0, 1] (up to resizing's overshoot)."""
        if isinstance(self.split, FolderImages):
            return self.split.raw(index)
        mean, std = self.own
        return self.split.inputs[index] * std.view(-1, 1, 1) + mean.view(-1, 1, 1)

    def _built(self) -> dict[str, Any]:
        if self._transforms is None:
            self._transforms = _transforms(self.settings, self.size, self.classes)
        return self._transforms


def _transforms(settings: Settings, size: tuple[int, int], classes: int | None) -> dict[str, Any]:
    """torchvision's transforms for ``settings``: ``pil`` (a decoded file), ``tensor`` (float pixels of
    an in-memory set; RandAugment on uint8) and ``mix`` (a batch)."""
    v2 = transforms_v2()
    built: dict[str, Any] = {}
    if settings.augment in AUGMENTING:
        geometric = [v2.RandomResizedCrop(size, scale=CROP_SCALE, antialias=True), v2.RandomHorizontalFlip()]
        colour = v2.RandAugment(**RANDAUGMENT) if settings.augment == "randaugment" else None
        built["pil"] = v2.Compose([*geometric, *([colour] if colour else [])])
        crop_flip = v2.Compose(geometric)

        def tensor(pixels: torch.Tensor) -> torch.Tensor:
            pixels = crop_flip(pixels)
            if colour is None:
                return pixels
            as_bytes = (pixels * 255).round().clamp(0, 255).to(torch.uint8)
            return colour(as_bytes).float() / 255.0

        built["tensor"] = tensor
    mixes = [v2.MixUp(alpha=float(settings.mixup), num_classes=classes)] if settings.mixup else []
    mixes += [v2.CutMix(alpha=float(settings.cutmix), num_classes=classes)] if settings.cutmix else []
    if mixes:
        built["mix"] = mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)
    return built


# ---------------------------------------------------------------- the loader


def _as_is(batch: Any) -> Any:
    return batch  # Examples.__getitems__ makes the whole batch


def held_batches(settings: Settings, device: torch.device | str) -> int:
    """The input batches a run holds in host memory when it trains on the CPU: the one in use and
    those the workers prepare ahead (``PREFETCH`` each); on another device its memory holds one, which
    the activations count."""
    return 1 + settings.workers * PREFETCH if torch.device(device).type == "cpu" else 0


def loader(
    data: Data, settings: Settings, start: int = 0, rank: int = 0, world: int = 1, device: torch.device | str = "cpu"
) -> DataLoader:
    """The DataLoader of the batches of steps ``start + 1 .. settings.steps`` (this process's shares)."""
    workers = settings.workers
    return DataLoader(
        Examples(data, settings, rank),
        batch_sampler=StepBatches(len(data.train), settings, start, rank, world),
        collate_fn=_as_is,
        num_workers=workers,
        pin_memory=torch.device(device).type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH if workers else None,
        generator=torch.Generator().manual_seed(0),  # the loader's own seeds: the global generator is left alone
    )


def batches(
    data: Data, settings: Settings, start: int, dist: Any = None, device: torch.device | str = "cpu"
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, targets)`` of steps ``start + 1 .. settings.steps`` in order, for this process of
    ``dist`` (a :class:`~crate_compose.training.distributed.Distributed`; one process when None). A
    data error met in a worker is raised here as a :class:`DataError`; closing the generator stops
    the workers."""
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    iterator = iter(loader(data, settings, start, rank, world, device))
    try:
        for expected in range(start + 1, settings.steps + 1):
            item = next(iterator)
            if isinstance(item, _Failure):
                raise DataError(item.message)
            step, x, y = item
            if step != expected:  # the loader keeps the sampler's order; this would be a bug
                raise RuntimeError(f"the data loader gave the batch of step {step} for step {expected}")
            yield x, y
    finally:
        _stop(iterator)


def _stop(iterator: Any) -> None:
    """Stop a DataLoader iterator's workers now (a generator closed early would leave them to the collector)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


class _Split(Dataset):
    """A split read a batch at a time (``__getitems__``), as :func:`batch_of` reads it, in a worker."""

    def __init__(self, split: Any) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor] | _Failure:
        try:
            return batch_of(self.split, torch.tensor(indices, dtype=torch.int64))
        except DataError as error:
            return _Failure(str(error))


def split_batches(
    split: Any, batch: int, workers: int = 0, count: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` examples of ``split`` (all by default) in order, ``batch`` at a time, as
    :func:`batch_of` gives them: sliced when the split is in memory, else decoded in ``workers``
    DataLoader processes (none: in this one). The batches are the same either way; a data error met
    in a worker is raised here as a :class:`DataError`."""
    size = len(split) if count is None else min(count, len(split))
    starts = range(0, size, batch)
    if workers == 0 or getattr(split, "tensors", None) is not None:
        for start in starts:
            yield batch_of(split, torch.arange(start, min(start + batch, size)))
        return
    iterator = iter(
        DataLoader(
            _Split(split),
            batch_sampler=[list(range(s, min(s + batch, size))) for s in starts],
            collate_fn=_as_is,
            num_workers=workers,
            prefetch_factor=PREFETCH,
        )
    )
    try:
        for item in iterator:
            if isinstance(item, _Failure):
                raise DataError(item.message)
            yield item
    finally:
        _stop(iterator)


# ---------------------------------------------------------------- torchvision


_STAND_INS: list[Any] = []  # operator declarations that must outlive the import (see _declare_missing)


def transforms_v2() -> Any:
    """``torchvision.transforms.v2``, imported on first use (torchvision is slow to import)."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        _declare_missing(error)
    from torchvision.transforms import v2

    return v2


def _declare_missing(error: RuntimeError) -> None:
    """Import torchvision whose C++ operators did not load.

    torchvision's Linux wheels on PyPI are CUDA builds; beside the CPU-only torch this project pins,
    their library of C++ operators (``nms``, ``roi_align``, ...) does not load, which torchvision
    allows, but torchvision 0.28 then registers fake kernels for two of them unconditionally and
    fails on import (``operator torchvision::nms does not exist``). The transforms used here are
    pure Python: each operator named so is declared (without a kernel: calling it still fails) and
    the import is tried again. Where torchvision's operators load, this never runs."""
    for _ in range(16):
        match = re.search(r"operator torchvision::(\w+) does not exist", str(error))
        if match is None:
            raise error
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "FRAGMENT")
        library.define(f"{match.group(1)}(Tensor input) -> Tensor")
        _STAND_INS.append(library)
        try:
            import torchvision  # noqa: F401

            return
        except RuntimeError as again:
            error = again
    raise error
