"""Offline data sets for training and probing white-box transformers.

Nothing here downloads anything, ever: every set is either shipped inside an installed package,
generated from a seed, or read from a folder the user already has on disk.

``load_data(name, ...)`` returns a :class:`Data`; ``name`` is a registered set's. Each set is described where
it is declared (:mod:`.builtin_sets`: its ``about``, ``inputs``, ``targets`` and ``description``), and
``docs/data-sets.md`` is made from those declarations (``crate-compose list data --markdown``).

Memory: ``image_size`` is at most ``settings.MAX_IMAGE_SIZE`` (8192), and a set held in memory
(digits, photos, pasted-digits) whose resized images would go over the memory limit (``memory_limit``, as
:func:`crate_compose.memory.resolve_limit` gives it: ``--memory-limit``, the environment, or 90% of
the memory available) is refused with the estimate before anything is allocated.

Targets (the second item of every sample) are consistent across sets: an int64 class index for
labeled images, ``-1`` for unlabeled images (photos), an int64 tensor of shape (n,) of group
labels for token sets, the next bytes for text, the input's own ids for tokenized text (``KIND:text``,
``KIND:folder:PATH``) and the class index for ``KIND:modules``. Inputs are float32 (int64 byte values or
token ids for text).

``Data.spec_overrides(spec)`` gives the override strings that make a spec take the data (see
there); ``crate-compose train SPEC --data digits`` uses it to size the spec's input.

Every set is declared in :mod:`.builtin_sets` and registered in :mod:`.set_registry`, which reads a name once
(:func:`resolve`, a :class:`~.registry.DataChoice`), says what each set provides (``labeled-images``,
``images``, ``next-byte-text``, ``tokenized-text``, ``labeled-tokens``, ``token-groups``: what a task trains
on) and takes sets of your own (:func:`.registry.register`); ``crate-compose list data`` lists them.
Here are :func:`load_data` (which loads a name or a choice), :func:`names`, :func:`takes` and :func:`verify`; the
record :class:`Data`, :class:`Tensors` and :func:`spec_overrides` are in :mod:`.record`, and the loaders beside
it: :mod:`.image_sets.shipped` (``digits``, ``fashion-mnist``, ``mnist``, ``photos``), :mod:`.image_sets.pasted`
(``pasted-digits``), :mod:`.image_sets.shapes`, :mod:`.subspaces`, :mod:`.image_sets.folders` (``folder:PATH``),
:mod:`.text_sets.corpus` (``text``), :mod:`.text_sets.tokens` (the tokenizers), :mod:`.text_sets.texts`
(``KIND:text``, ``KIND:folder:PATH``, ``KIND:modules``) and :mod:`.text_sets.shakespeare`. Their names are
importable from here too.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import DataError
from .image_sets.folders import FolderImages, image_header, load_folder, read_image
from .image_sets.pasted import load_pasted_digits
from .image_sets.shapes import load_shapes
from .image_sets.shipped import (
    load_archived,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    load_photos,
)
from .record import Data, Tensors, spec_overrides
from .set_registry import DataChoice, resolve
from .set_registry import names as registry_names
from .subspaces import load_subspaces, random_subspaces, sample_tokens
from .text_sets.corpus import load_text
from .text_sets.texts import load_modules, load_text_folder, load_tokens

__all__ = [
    "Data",
    "DataChoice",
    "Tensors",
    "load_archived",
    "load_data",
    "load_digits",
    "load_fashion_mnist",
    "load_folder",
    "load_mnist",
    "load_modules",
    "load_pasted_digits",
    "load_photos",
    "load_shapes",
    "load_subspaces",
    "load_text",
    "load_text_folder",
    "load_tokens",
    "names",
    "random_subspaces",
    "resolve",
    "sample_tokens",
    "spec_overrides",
    "takes",
    "verify",
]


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


# ---------------------------------------------------------------- entry point


def names() -> list[str]:
    """The data set names ``load_data`` accepts, as the registry writes them (:func:`.registry.names`:
    ``folder:PATH`` for a folder of your own; ``KIND`` is bytes, wordpiece or bpe, ``V`` a vocabulary size)."""
    return registry_names()


def takes(name: str | DataChoice) -> frozenset[str]:
    """What the set ``name`` (a name, or its :class:`~.registry.DataChoice`) follows besides its name and image
    size: ``"seed"`` (its random draws) and ``"spec"`` (a set that fits itself to the spec: text, its context;
    subspaces, its sizes); a set that takes neither is the same for every spec and seed, so a command loads it
    once (:attr:`.registry.DataChoice.takes`)."""
    return (name if isinstance(name, DataChoice) else resolve(name)).takes


def load_data(
    name: str | DataChoice,
    *,
    image_size: int | None = None,
    seed: int = 0,
    spec: Any = None,
    memory_limit: str | float | None = None,
    **options: Any,
) -> Data:
    """Load the data set ``name`` (see the module docstring): a name, read by :func:`.registry.resolve`, or the
    :class:`~.registry.DataChoice` it gave (not read again); ``options`` go to its loader.

    ``seed`` drives every random draw that is not a fixed split (digits, pasted-digits and folders have none, so
    ignore it);
    ``image_size`` applies to image sets only. Options per set: digits ``split_seed``; photos
    ``train_crops``, ``test_crops``; pasted-digits ``split_seed``, ``train_count``, ``test_count``; subspaces
    ``K``, ``p``, ``n``, ``delta``, ``d``,
    ``train_count``, ``test_count``; folder ``split_seed``; text and the tokenized text sets (``KIND:text``,
    ``KIND:folder:PATH``, ``KIND:modules``) ``context``. Sets that take ``spec`` fit themselves
    to it: text takes windows of its context, subspaces the sizes it declares (``K``, ``p``, ``n``,
    ``d`` given here win). ``memory_limit`` (``--memory-limit``; default as
    :func:`crate_compose.memory.resolve_limit`) bounds the image sets: digits and photos resized past
    it, and a folder's images checked from their headers, are refused before they are decoded.
    """
    choice = name if isinstance(name, DataChoice) else resolve(name)
    loader = choice.loader()
    filled = dict(choice.arguments)  # what the name's parameters give: not options
    accepted = [k for k in inspect.signature(loader).parameters if k not in filled]
    given = dict(options, **({"image_size": image_size} if image_size is not None else {}))
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        takes = ", ".join(accepted)
        raise DataError(f"data set '{choice.name}' does not take {', '.join(unknown)}; it takes: {takes}")
    if "seed" in accepted:
        given["seed"] = seed
    if "spec" in accepted:  # sets that fit themselves to the spec (text: its context; subspaces: its sizes)
        given["spec"] = spec
    if "memory_limit" in accepted:  # image sets: refused before they are allocated or decoded
        given.setdefault("memory_limit", memory_limit)
    data = loader(**given)
    if data.provides != choice.provides:
        raise DataError(
            f"data set '{choice.name}': its loader gave {data.provides!r} data, but the set is declared "
            f"to provide {choice.provides!r} ({choice.data_set.pattern})"
        )
    return data
