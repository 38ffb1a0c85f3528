"""``pasted-digits``: scikit-learn's digits pasted on textured backgrounds, with masks that are exactly where the
digit was pasted; generated from the split seed alone, so the same for every run seed; a run trains on it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from crate_compose.cli import main
from crate_compose.data import sets
from crate_compose.data.image_sets import generated, pasted
from crate_compose.errors import DataError
from crate_compose.settings import Settings
from crate_compose.training.run import train

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", "sizes.patch_size=8")  # 16 patches of 8x8


@pytest.fixture(scope="module")
def small():
    return sets.load_data("pasted-digits", train_count=40, test_count=24)


def _pixels(split, data, i: int) -> torch.Tensor:
    """Image ``i`` of ``split`` as it was made, before standardization."""
    return split.inputs[i] * torch.tensor(data.std).view(3, 1, 1) + torch.tensor(data.mean).view(3, 1, 1)


def test_the_set_is_fixed_by_its_split_seed_and_never_by_the_run_seed(small):
    again = sets.load_data("pasted-digits", train_count=40, test_count=24, seed=7)  # a run's seed changes nothing
    for one, two in ((small.train, again.train), (small.test, again.test)):
        assert torch.equal(one.inputs, two.inputs) and torch.equal(one.targets, two.targets)
        assert torch.equal(one.masks, two.masks)
    assert "seed" not in sets.takes("pasted-digits")  # loaded once for every seed of an ablation
    other = sets.load_data("pasted-digits", train_count=40, test_count=24, split_seed=1)
    assert not torch.equal(other.test.masks, small.test.masks)
    fewer = sets.load_data("pasted-digits", train_count=5, test_count=8)  # image i does not depend on the counts
    assert torch.equal(fewer.test.masks, small.test.masks[:8])
    assert torch.allclose(_pixels(fewer.test, fewer, 3), _pixels(small.test, small, 3), atol=1e-5)
    assert small.describe() == "pasted-digits: 40 train / 24 test, input [3, 32, 32], 10 classes (labeled-images)"
    assert small.sizes == {"channels": 3, "image_size": 32, "classes": 10}
    assert small.test.masks.shape == (24, 32, 32) and small.test.masks.dtype == torch.bool
    train_pixels = small.train.inputs.transpose(0, 1).reshape(3, -1)  # standardized with the train statistics
    assert torch.allclose(train_pixels.mean(1), torch.zeros(3), atol=1e-4)
    assert torch.allclose(train_pixels.std(1), torch.ones(3), atol=1e-3)
    assert sets.load_data("digits").train.masks is None  # every other set is as it was


@pytest.mark.parametrize("split, index", [("test", 0), ("test", 5), ("train", 17)])
def test_the_mask_is_exactly_where_the_digit_was_pasted(small, split, index):
    made = pasted.paste(0, split, index)
    loaded = getattr(small, split)
    assert torch.allclose(_pixels(loaded, small, index), torch.tensor(made.image, dtype=torch.float32), atol=1e-5)
    # the object made again from what was drawn: scikit-learn's digit, resized bilinearly, pasted at its place
    bunch = load_digits()
    digit = torch.tensor(bunch.images[made.digit] / 16.0)[None, None]
    alpha = (
        torch.nn.functional.interpolate(digit, size=(made.side, made.side), mode="bilinear", align_corners=False)[0, 0]
        .clamp(0, 1)
        .numpy()
    )
    expected = np.zeros((32, 32), dtype=bool)
    expected[made.top : made.top + made.side, made.left : made.left + made.side] = alpha > 0.5
    assert np.array_equal(loaded.masks[index].numpy(), expected) and np.array_equal(made.mask, expected)
    assert made.label == int(bunch.target[made.digit]) == int(loaded.targets[index])
    # alpha * colour + (1 - alpha) * background, a background in [0, 1]: within 1 - alpha of the colour
    box = made.image[:, made.top : made.top + made.side, made.left : made.left + made.side]
    assert (np.abs(box - np.array(made.colour)[:, None, None]) <= 1 - alpha + 1e-12).all()
    # the test objects are digits of the digits set's test split, never seen in training
    train_pool, test_pool = pasted._pools(bunch.target, 0)
    assert made.digit in (test_pool if split == "test" else train_pool)


def test_sizes_positions_and_backgrounds_vary():
    data = sets.load_data("pasted-digits", train_count=1, test_count=300)
    masks = data.test.masks
    assert masks.flatten(1).any(1).all()  # never empty
    rows, cols = masks.any(2), masks.any(1)
    top = rows.float().argmax(1)
    left = cols.float().argmax(1)
    height = rows.sum(1)
    assert len(set(height.tolist())) >= 8 and height.min() >= 3 and height.max() <= 24
    assert len(set(top.tolist())) >= 15 and len(set(left.tolist())) >= 15
    assert 0.03 < masks.float().mean() < 0.2
    made = [pasted.paste(0, "test", i) for i in range(12)]
    assert {m.background.split(" ")[0] for m in made} >= {"noise", "stripes", "checks", "mix"}
    assert {m.side for m in made} <= set(range(10, 25)) and len({m.side for m in made}) >= 4
    assert len(set(data.test.targets.tolist())) == 10
    sixteen = sets.load_data("pasted-digits", image_size=16, train_count=4, test_count=30)
    assert sixteen.input_shape == (3, 16, 16) and sixteen.test.masks.flatten(1).any(1).all()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"image_size": 4}, "image_size must be at least 8"),
        ({"train_count": 0}, "train_count must be a whole number"),
        ({"memory_limit": "1MB"}, "over the memory limit"),
        ({"crops": 3}, "does not take crops"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(DataError, match=message):
        sets.load_data("pasted-digits", **options)


def test_a_run_trains_on_it_fitted_to_its_images_and_segment_reads_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        pasted,
        "load_pasted_digits",  # the loader the set's declaration names, imported when loaded
        functools.partial(pasted.load_pasted_digits, train_count=64, test_count=16),
    )
    settings = Settings(
        task="classify",
        data="pasted-digits",
        steps=2,
        batch_size=8,
        eval_every=0,
        checkpoint_every=0,
        log_every=1,
        logger="none",
        warmup=1,
    )
    result = train(DIGITS, settings, overrides=list(TINY), out=tmp_path / "run", progress=False)
    assert 0 <= result.metrics["test_accuracy"] <= 1
    written = (tmp_path / "run" / "final" / "spec.yaml").read_text()
    assert "shape: [3, 32, 32]" in written and "image_size: 32" in written  # fitted to the data
    capsys.readouterr()
    assert main(["segment", str(tmp_path / "run"), "--samples", "4", "--images", "1"]) == 0
    printed = capsys.readouterr()
    assert "segmenting its final/" in printed.err
    folder = tmp_path / "run" / "segmentation" / "final"  # beside the run's weights, never in them
    assert {p.name for p in folder.iterdir()} == {
        ".lock",
        "segmentation.json",
        "segmentation-trained.png",
        "segmentation-untrained.png",
    }
    result = json.loads((folder / "segmentation.json").read_text())
    assert set(result["runs"]) == {"trained", "untrained"} and result["seed"] == 0
    assert "Jaccard trained" in printed.out and "Jaccard untrained" in printed.out


def test_pasted_digits_n_names_the_set_with_n_training_images():
    """``pasted-digits:N``: N training images, the same test split; a bad N is a DataError naming the form."""
    from crate_compose.data.sets import load_data

    small, large = load_data("pasted-digits:50"), load_data("pasted-digits:120")
    assert (len(small.train), len(large.train), len(small.test)) == (50, 120, 1000)
    assert torch.equal(small.test.masks, large.test.masks)
    for bad in ("pasted-digits:0", "pasted-digits:", "pasted-digits:1e3", "pasted-digits:2000000"):
        with pytest.raises(DataError, match="pasted-digits:N"):
            load_data(bad)


def test_a_large_set_is_kept_once_made_checked_when_read_and_made_again_when_damaged(tmp_path, monkeypatch, capsys):
    """pasted-digits:40000 takes a minute to make: from CACHE_FROM images on, a made split is kept in the data
    cache and read back (the same tensors, nothing drawn again); a damaged file is said and made again."""
    from crate_compose.data.image_sets import pasted

    monkeypatch.setenv("CRATE_COMPOSE_DATA", str(tmp_path))
    monkeypatch.setattr(pasted, "CACHE_FROM", 1)
    made = pasted.load_pasted_digits(train_count=20, test_count=10)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["pasted-digits-v1-0-32-test-10.safetensors", "pasted-digits-v1-0-32-train-20.safetensors"]
    real = pasted._make
    monkeypatch.setattr(pasted, "_make", lambda *a, **k: (_ for _ in ()).throw(AssertionError("drawn again")))
    again = pasted.load_pasted_digits(train_count=20, test_count=10)
    for a, b in ((made.train, again.train), (made.test, again.test)):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and torch.equal(a.masks, b.masks)
    monkeypatch.setattr(pasted, "_make", real)
    damaged = tmp_path / files[1]
    damaged.write_bytes(damaged.read_bytes()[:200])  # truncated
    capsys.readouterr()
    remade = pasted.load_pasted_digits(train_count=20, test_count=10)
    assert "does not hold the pasted-digits images" in capsys.readouterr().err
    assert torch.equal(remade.train.inputs, made.train.inputs)
    assert generated.read_cache(pasted.NAME, damaged, 20, 32, 10) is not None  # written whole again
