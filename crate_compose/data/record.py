"""The record every data set is, and what every loader of :mod:`crate_compose.data.sets` shares.

:class:`Data` is a data set ready to train on (its splits, input shape, classes, statistics and the
spec sizes it fixes); :class:`Tensors` a split held in memory; :func:`spec_overrides` the ``--set``
strings that fit a spec to a data set; :func:`check_size` the bound on an image side every image set
checks before it allocates anything. The loaders (:mod:`.image_sets.shipped`, :mod:`.subspaces`, :mod:`.image_sets.folders`,
:mod:`.text_sets.corpus`) import from here, and :mod:`.sets` dispatches to them, so the import graph has no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import Dataset

from ..errors import DataError
from ..settings import MAX_IMAGE_SIZE

__all__ = ["Data", "Tensors", "check_size", "declared_sizes", "spec_overrides"]


class Tensors(Dataset):
    """A data set held in memory: ``inputs[i]`` and ``targets[i]``; ``crops`` (photos only) is the
    (photo, top, left) of every sample; ``masks`` (pasted-digits and shapes only) the ground-truth segmentation of
    every image, ``(N, H, W)`` bool (True on the object), which ``crate-compose segment`` scores
    attention against. A split without masks has ``masks`` None."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        crops: torch.Tensor | None = None,
        masks: torch.Tensor | None = None,
    ):
        assert len(inputs) == len(targets)
        assert masks is None or (masks.dtype == torch.bool and masks.shape == (len(inputs), *inputs.shape[-2:]))
        self.inputs, self.targets, self.crops, self.masks = inputs, targets, crops, masks

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


@dataclass
class Data:
    """A data set ready to train on.

    ``train``/``test`` yield ``(input, target)``; ``input_shape`` is one input's shape (no batch
    axis); ``classes`` the number of classes (None when unlabeled); ``provides`` the kind of data it is, as
    its set declares it (:data:`crate_compose.data.set_registry.PROVIDED`): "labeled-images", "images" (without
    labels), "token-groups" (token sets with group labels), "next-byte-text" (byte windows, target the next
    bytes), "tokenized-text" (BERT's ``[CLS] .. [SEP]`` windows of token ids, target the same ids: the task
    masks them) or "labeled-tokens" (token windows, target a class), what a task trains on
    (:attr:`crate_compose.tasks.Task.data_kinds`); ``mean``/``std`` the
    per-channel statistics the inputs were standardized with (None for token sets); ``subspaces``
    the true [U_1 .. U_K] for "subspaces"; ``sizes`` the spec sizes this data fixes; ``unigram_loss``
    the held-out loss of the train split's token frequencies (text sets), ``bigram_loss`` its pairs' (next-token
    sets); ``tokenizer`` the
    :class:`~.text_sets.tokens.Tokenizer` that made the ids of a tokenized text set (``KIND:text``,
    ``KIND:folder:PATH``, ``KIND:modules``; None elsewhere), its JSON part of the run's data fingerprint;
    ``views`` the same data in the form of another kind, made when asked (a tokenized text set's token streams
    as "next-byte-text" windows, for a language model): :meth:`for_kinds`.
    """

    name: str
    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    classes: int | None
    provides: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    subspaces: torch.Tensor | None = None
    class_names: list[str] | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    unigram_loss: float | None = None
    bigram_loss: float | None = None
    tokenizer: Any = None
    views: dict[str, Callable[[], "Data"]] = field(default_factory=dict, repr=False)

    def for_kinds(self, kinds: Iterable[str]) -> "Data":
        """This data in a form a task that trains on ``kinds`` takes: itself when it provides one of them, else
        its view of the first of them it has one of, else itself (the task's check then says what fits)."""
        kinds = tuple(kinds)
        if self.provides in kinds:
            return self
        view = next((self.views[kind] for kind in kinds if kind in self.views), None)
        return view() if view is not None else self

    def spec_overrides(self, spec: Any) -> list[str]:
        """Override strings that make ``spec`` (a loaded Spec or a spec mapping) take this data."""
        return spec_overrides(self, spec)

    def describe(self) -> str:
        """One line: name, split sizes, input shape and classes."""
        classes = f", {self.classes} classes" if self.classes else ""
        return (
            f"{self.name}: {len(self.train)} train / {len(self.test)} test, "
            f"input {list(self.input_shape)}{classes} ({self.provides})"
        )


def spec_overrides(data: Data, spec: Any) -> list[str]:
    """The ``--set`` strings that fit ``spec`` (a loaded Spec, or a spec mapping) to ``data``.

    ``input.shape=[...]`` (the data's input shape); besides, each size the data fixes
    (``data.sizes``) is set where the spec declares a size of that name, so the rest of the spec
    follows: images fix ``channels``, ``classes`` (labeled data only) and ``image_size`` (square
    images only; other images set ``input.shape`` alone); token sets fix ``tokens``, ``d``,
    ``subspaces`` and ``subspace_dim`` (:func:`~.subspaces.load_subspaces` generates the sizes the spec
    declares, so these differ only where K, p, n or d were given). Sizes the spec does not declare
    are left alone, and a value the spec already has is not repeated (any override makes the loader
    name the spec a variant), so a spec written for the data gets ``[]``.
    """
    declared = declared_sizes(spec)
    if isinstance(spec, dict):
        shape = (spec.get("input") or {}).get("shape")
    else:
        shape = getattr(getattr(spec, "input", None), "shape", None)
    out = []
    if shape != list(data.input_shape):
        out.append(f"input.shape=[{', '.join(str(size) for size in data.input_shape)}]")
    out += [f"sizes.{k}={v}" for k, v in data.sizes.items() if k in declared and declared[k] != v]
    return out


def declared_sizes(spec: Any) -> dict:
    """The sizes ``spec`` declares (a loaded Spec or a spec mapping; {} for None)."""
    sizes = spec.get("sizes") if isinstance(spec, dict) else getattr(spec, "sizes", None)
    return sizes if isinstance(sizes, dict) else {}


def check_size(image_size: int | None, where: str) -> None:
    """Refuse an image side that is not a whole number in [1, MAX_IMAGE_SIZE] (``--image-size 100000``),
    before anything is allocated."""
    if image_size is not None and (
        not isinstance(image_size, int) or isinstance(image_size, bool) or not 1 <= image_size <= MAX_IMAGE_SIZE
    ):
        raise DataError(f"{where}: image_size must be a whole number in [1, {MAX_IMAGE_SIZE}]; got {image_size!r}")
