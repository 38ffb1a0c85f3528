"""The offline data sets of crate_compose.data.sets (their loaders: crate_compose.data.image_sets.shipped, .subspaces,
.folders, .corpus): shapes, splits, determinism, errors, spec fitting."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crate_compose.data import record
from crate_compose.data import sets as D
from crate_compose.data.image_sets import folders as images
from crate_compose.data.image_sets import shipped
from crate_compose.errors import DataError
from crate_compose.spec_language.loader import load

DIGITS = str(Path(__file__).resolve().parents[1] / "specs" / "crate-digits.yaml")


@pytest.fixture(scope="module")
def digits():
    return D.load_data("digits")


@pytest.fixture(scope="module")
def photos():
    return D.load_data("photos", train_crops=256, test_crops=64)


@pytest.fixture(scope="module")
def subspaces():
    return D.load_data("subspaces", train_count=64, test_count=16)


def stacked(split):
    inputs, targets = zip(*(split[i] for i in range(len(split))))
    return torch.stack(inputs), torch.as_tensor(np.array(targets))


# ---------------------------------------------------------------- digits


def test_digits_shapes_counts_and_normalization(digits):
    assert (len(digits.train), len(digits.test)) == (1437, 360)
    assert digits.input_shape == (1, 8, 8) and digits.classes == 10 and digits.provides == "labeled-images"
    x, y = digits.train[0]
    assert x.dtype == torch.float32 and x.shape == (1, 8, 8) and y.dtype == torch.int64
    train = digits.train.inputs
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-3
    assert len(digits.mean) == len(digits.std) == 1 and 0 < digits.mean[0] < 1


def test_digits_split_is_stratified_and_fixed(digits):
    train = Counter(digits.train.targets.tolist())
    test = Counter(digits.test.targets.tolist())
    assert sorted(train) == sorted(test) == list(range(10))
    for label in range(10):  # each class keeps its 20% share within one sample
        total = train[label] + test[label]
        assert abs(test[label] - 0.2 * total) <= 1
    again = D.load_data("digits", seed=5)  # seed does not move the split
    assert torch.equal(again.test.inputs, digits.test.inputs)
    other = D.load_data("digits", split_seed=1)
    assert not torch.equal(other.test.targets, digits.test.targets)


def test_digits_resize(digits):
    big = D.load_data("digits", image_size=16)
    assert big.input_shape == (1, 16, 16) and big.train[0][0].shape == (1, 16, 16)
    assert torch.equal(big.train.targets, digits.train.targets)


# ---------------------------------------------------------------- photos


def test_photos_shapes_and_labels(photos):
    assert (len(photos.train), len(photos.test)) == (256, 64)
    assert photos.input_shape == (3, 32, 32) and photos.classes is None and photos.provides == "images"
    x, y = photos.train[0]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and int(y) == -1
    assert len(photos.mean) == len(photos.std) == 3
    assert abs(photos.train.inputs.mean().item()) < 0.5  # standardized with the train region's statistics


def test_photos_train_and_test_regions_are_disjoint(photos):
    regions = shipped._photo_regions()
    for split, side in ((photos.train, 0), (photos.test, 1)):
        for (photo, top, left), crop in zip(split.crops.tolist(), split.inputs):
            region = regions[photo][side]
            assert left + 32 <= region.shape[-1] and top + 32 <= region.shape[-2]
            raw = region[:, top : top + 32, left : left + 32]
            expected = shipped.standardize(raw[None], torch.tensor(photos.mean), torch.tensor(photos.std))[0]
            assert torch.allclose(crop, expected, atol=1e-5)
    full = shipped._photo_regions()[0]
    assert full[0].shape[-1] + full[1].shape[-1] == 640 and full[0].shape[-1] == 480  # left 75% / right 25%
    assert {p for p, _, _ in photos.train.crops.tolist()} == {0, 1}


def test_photos_deterministic(photos):
    same = D.load_data("photos", train_crops=256, test_crops=64)
    other = D.load_data("photos", seed=1, train_crops=256, test_crops=64)
    assert torch.equal(same.train.inputs, photos.train.inputs)
    assert not torch.equal(other.train.inputs, photos.train.inputs)
    assert torch.equal(other.test.inputs, photos.test.inputs)  # test crops never depend on the seed
    small = D.load_data("photos", image_size=16, train_crops=8, test_crops=8)
    assert small.input_shape == (3, 16, 16) and small.train[0][0].shape == (3, 16, 16)


# ---------------------------------------------------------------- subspaces


def test_subspaces_shapes_and_basis(subspaces):
    assert subspaces.input_shape == (48, 48) and subspaces.provides == "token-groups" and subspaces.classes is None
    x, labels = subspaces.train[0]
    assert x.dtype == torch.float32 and x.shape == (48, 48) and labels.shape == (48,)
    assert labels.dtype == torch.int64 and Counter(labels.tolist()) == {0: 16, 1: 16, 2: 16}
    U = subspaces.subspaces
    assert U.shape == (48, 48) and torch.allclose(U.T @ U, torch.eye(48), atol=1e-5)


def test_subspaces_tokens_lie_near_their_group(subspaces):
    U = subspaces.subspaces
    tokens, labels = subspaces.train.inputs, subspaces.train.targets
    for k in range(3):
        Uk = U[:, 16 * k : 16 * (k + 1)]
        Z = tokens[labels == k]  # (m, d)
        inside = Z @ Uk @ Uk.T
        snr = inside.norm() / (Z - inside).norm()
        assert snr > 3  # delta = 0.1: about 1 / (delta * sqrt(K - 1)) = 7
    # the label of each token is the subspace holding most of its energy
    energy = torch.stack([(tokens @ U[:, 16 * k : 16 * (k + 1)]).norm(dim=-1) for k in range(3)], -1)
    assert torch.equal(energy.argmax(-1), labels)


def test_subspaces_seeded_and_parameters(subspaces):
    same = D.load_data("subspaces", train_count=64, test_count=16)
    assert torch.equal(same.train.inputs, subspaces.train.inputs) and torch.equal(same.subspaces, subspaces.subspaces)
    other = D.load_data("subspaces", seed=1, train_count=4, test_count=4)
    assert not torch.equal(other.subspaces, subspaces.subspaces)
    wide = D.load_data("subspaces", K=2, p=4, n=10, d=12, delta=0.0, train_count=3, test_count=2)
    assert wide.input_shape == (10, 12) and wide.subspaces.shape == (12, 8)
    x, labels = wide.train[0]
    U = wide.subspaces
    for token, k in zip(x, labels):  # delta = 0: exactly in its own subspace
        Uk = U[:, 4 * k : 4 * (k + 1)]
        assert torch.allclose(Uk @ (Uk.T @ token), token, atol=1e-5)


# ---------------------------------------------------------------- folder


def write_folder(root, sizes=((10, 12), (16, 16), (8, 20), (12, 12))):
    """3 classes x 4 PNGs of different sizes (one grayscale per class)."""
    rng = np.random.default_rng(0)
    for _c, name in enumerate(["cat", "bird", "dog"]):
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            if i == 0:
                Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L").save(root / name / f"{i}.PNG")
            else:
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
        (root / name / "notes.txt").write_text("not an image")


def test_folder_split_resize_and_lazy_reading(tmp_path):
    write_folder(tmp_path)
    data = D.load_data(f"folder:{tmp_path}", image_size=8)
    assert data.class_names == ["bird", "cat", "dog"] and data.classes == 3
    assert (len(data.train), len(data.test)) == (9, 3)
    assert sorted(data.test.labels) == [0, 1, 2]  # stratified: one image of each class held out
    assert not set(data.train.files) & set(data.test.files)
    assert data.input_shape == (3, 8, 8)
    x, y = data.train[0]
    assert x.dtype == torch.float32 and x.shape == (3, 8, 8) and isinstance(y, int)
    assert isinstance(data.train, images.FolderImages)  # files, read on access
    victim = data.test.files[0]
    victim.write_bytes(b"broken")  # changed after loading: only reading it fails
    with pytest.raises(DataError, match=victim.name):
        data.test[0]
    again = D.load_data(f"folder:{tmp_path}", image_size=8)
    assert again.train.files == data.train.files  # the split is fixed


def test_folder_train_test_subfolders_and_common_size(tmp_path):
    write_folder(tmp_path / "train", sizes=((6, 6),) * 2)
    write_folder(tmp_path / "val", sizes=((6, 6),))
    data = D.load_data(f"folder:{tmp_path}")  # all 6x6: no image_size needed
    assert (len(data.train), len(data.test)) == (6, 3) and data.input_shape == (3, 6, 6)
    assert all(f.parent.parent.name == "val" for f in data.test.files)
    overrides = data.spec_overrides(load("crate-tiny"))  # crate-tiny already has 3 channels
    assert overrides == ["input.shape=[3, 6, 6]", "sizes.image_size=6", "sizes.classes=3"]


def test_folder_errors(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        D.load_data(f"folder:{tmp_path / 'missing'}")
    with pytest.raises(DataError, match="no class folders"):
        D.load_data(f"folder:{tmp_path}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty.*without images"):
        D.load_data(f"folder:{tmp_path}")
    (tmp_path / "empty").rmdir()
    write_folder(tmp_path)
    with pytest.raises(DataError, match="differ in size.*image_size"):
        D.load_data(f"folder:{tmp_path}")
    (tmp_path / "dog" / "3.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="3.png: cannot read"):
        D.load_data(f"folder:{tmp_path}", image_size=8)


# ---------------------------------------------------------------- names, options, specs


def test_unknown_name_and_options():
    with pytest.raises(DataError, match="unknown data set 'digit'.*did you mean 'digits'"):
        D.load_data("digit")
    with pytest.raises(DataError, match="fashion-mnist, mnist, photos, subspaces"):
        D.load_data("cifar10")
    with pytest.raises(DataError, match="does not take delta"):
        D.load_data("digits", delta=0.1)
    with pytest.raises(DataError, match="image_size"):
        D.load_data("subspaces", image_size=8)
    assert issubclass(DataError, ValueError)


def test_spec_overrides_fit_crate_tiny_to_digits(digits):
    overrides = digits.spec_overrides(load("crate-tiny"))
    assert overrides[0] == "input.shape=[1, 8, 8]"
    spec = load("crate-tiny", overrides)
    assert spec.input.shape == [1, 8, 8]
    assert spec.sizes["classes"] == 10 and spec.sizes["image_size"] == 8 and spec.sizes["channels"] == 1
    assert spec.head[0].args["classes"] == 10


def test_spec_overrides_skip_undeclared_sizes(digits, subspaces):
    assert record.spec_overrides(digits, {"sizes": {"d": 4}}) == ["input.shape=[1, 8, 8]"]
    photos = record.Data("photos", None, None, (3, 8, 12), None, "images", sizes={"channels": 3})
    overrides = photos.spec_overrides({"sizes": {"image_size": 8, "channels": 1}})
    assert overrides == ["input.shape=[3, 8, 12]", "sizes.channels=3"]  # not square: no image_size
    fitted = load("specs/aot-subspaces.yaml", subspaces.spec_overrides(load("specs/aot-subspaces.yaml")))
    assert fitted.input.shape == [48, 48] and fitted.sizes["subspace_dim"] == 16
    assert subspaces.spec_overrides(fitted) == []  # a spec that already takes the data needs nothing


def test_digits_batch_runs_through_a_built_model(digits):
    import crate_compose as cc

    sizes = ["sizes.patch_size=2", "sizes.d=32", "sizes.heads=2", "sizes.head_dim=16", "sizes.depth=1"]
    model = cc.build(load("crate-tiny", digits.spec_overrides(load("crate-tiny")) + sizes), seed=0)
    batch = torch.stack([digits.train[i][0] for i in range(4)])
    assert model(batch)["output"].shape == (4, 10)


def test_import_does_not_load_matplotlib():
    code = "import sys, crate_compose.data.sets; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- bounds: image sizes, bombs, broken files


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """A PNG of 13000x13000 black pixels: a few hundred kB on disk, 169 MB as 8-bit pixels, several GB
    on the way to float32."""
    path = tmp_path_factory.mktemp("bomb") / "huge.png"
    Image.new("L", (13000, 13000)).save(path, optimize=True)
    return path


def small_images(root, names=("cats", "dogs"), count=4, side=8):
    rng = np.random.default_rng(0)
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


@pytest.fixture
def never_decoded(monkeypatch):
    """Fail the test if Pillow decodes an image of more than 10^7 pixels."""
    from PIL import ImageFile

    load = ImageFile.ImageFile.load

    def guarded(self):
        assert self.size[0] * self.size[1] <= 10**7, f"decoded {self.size}"
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", guarded)


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_decompression_bomb_is_refused_from_its_header(tmp_path, bomb, never_decoded, split):
    import time

    small_images(tmp_path / "train")
    small_images(tmp_path / "test", count=2)
    target = tmp_path / split / "cats" / "huge.png"
    shutil.copy(bomb, target)
    started = time.perf_counter()
    with pytest.raises(DataError) as raised:
        data = D.load_data(f"folder:{tmp_path}", image_size=8, memory_limit="1GB")  # the stats sample reads train
        D.verify(data)  # the test split is checked here, before a run's first step
    message = str(raised.value)
    assert message.startswith(f"{target}: 13000x13000 pixels") and "\n" not in message, message
    assert "decompression-bomb limit" in message or "over the memory limit of 1.0 GB" in message
    assert time.perf_counter() - started < 5


def test_an_image_over_the_memory_limit_is_refused_with_its_size(tmp_path, never_decoded):
    small_images(tmp_path)
    target = tmp_path / "dogs" / "wide.png"
    Image.new("L", (3000, 3000)).save(target)
    with pytest.raises(
        DataError,
        match=r"wide.png: 3000x3000 pixels would take about .* decoded, over the "
        r"memory limit of 10.0 MB \(--memory-limit\)",
    ):
        D.load_data(f"folder:{tmp_path}", memory_limit="10MB")  # every header is read for the common size
    with pytest.raises(DataError, match="wide.png: 3000x3000 pixels"):
        images.read_image(target, (8, 8), (10e6, "--memory-limit"))
    assert images.read_image(target, (8, 8), (None, "none")).shape == (3, 8, 8)  # within the bomb threshold: read


def test_image_sizes_past_the_bound_or_the_memory_limit_are_refused_before_allocating(capsys):
    import time

    from crate_compose.cli import main

    started = time.perf_counter()
    with pytest.raises(DataError, match=r"digits: image_size must be a whole number in \[1, 8192\]; got 100000"):
        D.load_data("digits", image_size=100000)
    with pytest.raises(
        DataError,
        match=r"digits: 1,797 images of 1x8192x8192 would take about 2.4 TB in memory, "
        r"over the memory limit of 1.0 GB \(--memory-limit\); give a smaller --image-size",
    ):
        D.load_data("digits", image_size=8192, memory_limit="1GB")
    with pytest.raises(DataError, match="photos: 4,608 images of 3x64x64 would take"):
        D.load_data("photos", image_size=64, memory_limit="10MB")
    for command in ("train", "probe"):
        with pytest.raises(SystemExit) as exited:
            main([command, DIGITS, "--image-size", "100000"])
        assert exited.value.code == 2
        assert "--image-size: 100000: must be in [1, 8192]" in capsys.readouterr().err
    assert time.perf_counter() - started < 5


def truncated(path):
    """Cut an image file to half its bytes: its header reads, its pixels do not."""
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])


def test_verify_names_a_truncated_test_image_and_passes_sound_sets(tmp_path, digits):
    small_images(tmp_path / "train", side=32)
    small_images(tmp_path / "test", count=2, side=32)
    data = D.load_data(f"folder:{tmp_path}", image_size=8)
    D.verify(data)
    D.verify(digits)  # in memory: nothing to check
    victim = tmp_path / "test" / "dogs" / "1.png"
    truncated(victim)
    data = D.load_data(f"folder:{tmp_path}", image_size=8)  # test images are not read when loading
    with pytest.raises(DataError, match=rf"^{victim}: cannot read the image \(.*truncated"):
        D.verify(data)
    victim.write_bytes(b"not an image")
    with pytest.raises(DataError, match=rf"^{victim}: cannot read the image"):
        D.verify(data)


def test_train_names_a_truncated_test_image_before_the_first_step(tmp_path, capsys):
    from crate_compose.cli import main

    small_images(tmp_path / "images" / "train", side=32)
    small_images(tmp_path / "images" / "test", count=2, side=32)
    victim = tmp_path / "images" / "test" / "cats" / "0.png"
    truncated(victim)
    sets = [arg for o in ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1") for arg in ("--set", o)]
    code = main(
        [
            "train",
            DIGITS,
            *sets,
            "--data",
            f"folder:{tmp_path / 'images'}",
            "--image-size",
            "8",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{victim}: cannot read the image" in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()
