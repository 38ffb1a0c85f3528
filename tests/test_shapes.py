"""``shapes``: large shapes on backgrounds from a shared pool, with masks that are where the shape's alpha is above
0.5; every image made again from its split seed, split and index alone; a run trains on it and segment reads it."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch
from test_pasted import DIGITS, TINY, _pixels  # a tiny crate-digits, and an image as made

from crate_compose.cli import main
from crate_compose.data import sets
from crate_compose.data.image_sets import shapes
from crate_compose.errors import DataError
from crate_compose.settings import Settings
from crate_compose.training.run import train


@pytest.fixture(scope="module")
def small():
    return sets.load_data("shapes", train_count=40, test_count=300)


def test_the_set_is_fixed_by_its_split_seed_alone(small):
    again = sets.load_data("shapes", train_count=40, test_count=300, seed=7)  # a run's seed changes nothing
    for one, two in ((small.train, again.train), (small.test, again.test)):
        assert torch.equal(one.inputs, two.inputs) and torch.equal(one.targets, two.targets)
        assert torch.equal(one.masks, two.masks)
    assert "seed" not in sets.takes("shapes")
    other = sets.load_data("shapes", train_count=40, test_count=300, split_seed=1)
    assert not torch.equal(other.test.masks, small.test.masks) and not torch.equal(other.test.inputs, small.test.inputs)
    fewer = sets.load_data("shapes", train_count=5, test_count=8)  # image i depends on nothing but i
    assert torch.equal(fewer.test.masks, small.test.masks[:8])
    assert torch.allclose(_pixels(fewer.test, fewer, 3), _pixels(small.test, small, 3), atol=1e-5)
    assert small.describe() == "shapes: 40 train / 300 test, input [3, 32, 32], 10 classes (labeled-images)"
    assert small.sizes == {"channels": 3, "image_size": 32, "classes": 10}
    assert small.class_names == list(shapes.CLASSES) and len(set(shapes.CLASSES)) == 10
    assert small.test.masks.shape == (300, 32, 32) and small.test.masks.dtype == torch.bool
    assert small.test.inputs.shape == (300, 3, 32, 32) and small.test.inputs.dtype == torch.float32
    train_pixels = small.train.inputs.transpose(0, 1).reshape(3, -1)  # standardized with the train statistics
    assert torch.allclose(train_pixels.mean(1), torch.zeros(3), atol=1e-4)
    assert torch.allclose(train_pixels.std(1), torch.ones(3), atol=1e-3)


@pytest.mark.parametrize("split, index", [("test", 0), ("test", 123), ("train", 17)])
def test_an_image_made_alone_is_the_loaded_one_and_its_mask_is_its_alpha_above_a_half(small, split, index):
    made = shapes.draw(0, split, index)
    loaded = getattr(small, split)
    assert torch.allclose(_pixels(loaded, small, index), torch.tensor(made.image, dtype=torch.float32), atol=1e-5)
    assert np.array_equal(loaded.masks[index].numpy(), made.mask) and made.label == int(loaded.targets[index])
    assert np.array_equal(made.mask, made.alpha > 0.5) and made.mask.any()
    assert made.name == shapes.CLASSES[made.label] and made.kind.split(" ")[0] in ("noise", "stripes", "checks", "mix")
    # alpha * colour + (1 - alpha) * the pool's background: where alpha is 0, the pool background itself
    background = shapes.pool(0, 32)[0][made.background]
    assert np.allclose(made.image, made.alpha * np.array(made.colour)[:, None, None] + (1 - made.alpha) * background)
    assert np.array_equal(made.image[:, made.alpha == 0], background[:, made.alpha == 0])
    assert 16 <= made.side <= 27.2 and abs(made.angle) <= math.radians(20) and 0.8 <= made.aspect <= 1.25


def _lens(r1: float, r2: float, d: float) -> float:
    """The area two discs of radii ``r1`` and ``r2`` whose centres are ``d`` apart have in common."""
    return (
        r1**2 * math.acos((d * d + r1 * r1 - r2 * r2) / (2 * d * r1))
        + r2**2 * math.acos((d * d + r2 * r2 - r1 * r1) / (2 * d * r2))
        - 0.5 * math.sqrt((-d + r1 + r2) * (d + r1 - r2) * (d - r1 + r2) * (d + r1 + r2))
    )


AREAS = {  # each shape's area in its box [-1, 1]^2, from its description
    "disc": math.pi,
    "square": 1.8**2,
    "triangle": 2.0,
    "ring": math.pi * (1 - 0.55**2),
    "cross": 2 * 2 * 0.66 - 0.66**2,
    "star": 10 * 0.5 * 0.45 * math.sin(math.pi / 5),
    "crescent": math.pi - _lens(1, 0.8, 0.5),
    "L": 4 - 1.3**2,
    "half disc": math.pi / 2,
    "T": 2 * 0.7 + 0.7 * 1.3,
}


def test_each_shape_has_the_area_its_description_gives_and_the_images_alpha_sums_to_it(small):
    grid = (np.arange(1000) + 0.5) / 500 - 1  # a million points of the box
    x, y = np.meshgrid(grid, grid)
    for label, name in enumerate(shapes.CLASSES):
        assert abs(shapes.inside(label, x, y).mean() * 4 - AREAS[name]) < 0.01, name
    checked = 0
    for index in range(40):  # a shape wholly inside its image: its alpha sums to its area in pixels
        made = shapes.draw(0, "test", index)
        if made.alpha[[0, -1]].any() or made.alpha[:, [0, -1]].any():
            continue
        checked += 1
        assert made.alpha.sum() == pytest.approx(AREAS[made.name] * (made.side / 2) ** 2, rel=0.03), made.name
    assert checked >= 20


def test_classes_backgrounds_colours_sizes_and_places_vary_independently(small):
    labels = small.test.targets.numpy()
    counts = np.bincount(labels, minlength=10)
    assert counts.min() >= 15 and counts.max() <= 45  # 300 images, 30 a class expected
    made = [shapes.draw(0, "test", i) for i in range(60)]
    backgrounds = [m.background for m in made]
    assert len(set(backgrounds)) >= 25 and max(backgrounds) < shapes.POOL
    for label in range(3):  # a class lies on many backgrounds, in several colours
        of = [m for m in made if m.label == label]
        assert len({m.background for m in of}) >= len(of) // 2 and len({np.argmax(m.colour) for m in of}) >= 2
    masks = small.test.masks
    share = masks.flatten(1).float().mean(1)
    assert 0.1 < share.mean() < 0.45 and share.min() > 0.03  # large objects
    rows, cols = masks.any(2).float(), masks.any(1).float()
    assert len(set(rows.argmax(1).tolist())) >= 10 and len(set(cols.argmax(1).tolist())) >= 10
    eight = sets.load_data("shapes", image_size=8, train_count=4, test_count=200)
    assert eight.input_shape == (3, 8, 8) and eight.test.masks.flatten(1).any(1).all()
    assert shapes.draw(0, "test", 5, size=64).label == made[5].label  # the same draws at every size


@pytest.mark.parametrize(
    "options, message",
    [
        ({"image_size": 4}, "image_size must be at least 8"),
        ({"train_count": 0}, "train_count must be a whole number"),
        ({"test_count": True}, "test_count must be a whole number"),
        ({"memory_limit": "1MB"}, "over the memory limit"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(DataError, match=message):
        sets.load_data("shapes", **options)


def test_shapes_n_names_the_set_with_n_training_images():
    small = sets.load_data("shapes:50", test_count=10)
    assert (len(small.train), len(small.test)) == (50, 10)
    for bad in ("shapes:0", "shapes:", "shapes:1e3", "shapes:2000000"):
        with pytest.raises(DataError, match="shapes:N"):
            sets.load_data(bad)


def test_a_large_set_is_kept_once_made(tmp_path, monkeypatch):
    monkeypatch.setenv("CRATE_COMPOSE_DATA", str(tmp_path))
    monkeypatch.setattr(shapes, "CACHE_FROM", 1)
    made = shapes.load_shapes(train_count=20, test_count=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shapes-v1-0-32-test-10.safetensors",
        "shapes-v1-0-32-train-20.safetensors",
    ]
    monkeypatch.setattr(shapes, "_make", lambda *a, **k: (_ for _ in ()).throw(AssertionError("drawn again")))
    again = shapes.load_shapes(train_count=20, test_count=10)
    assert torch.equal(made.test.inputs, again.test.inputs) and torch.equal(made.train.masks, again.train.masks)


def test_a_run_trains_on_it_and_segment_scores_its_masks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shapes, "load_shapes", functools.partial(shapes.load_shapes, train_count=64, test_count=16))
    settings = Settings(
        task="classify",
        data="shapes",
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
    capsys.readouterr()
    assert main(["segment", str(tmp_path / "run"), "--samples", "4", "--images", "1"]) == 0
    result = json.loads((tmp_path / "run" / "segmentation" / "final" / "segmentation.json").read_text())
    assert set(result["runs"]) == {"trained", "untrained"}
    assert "Jaccard trained" in capsys.readouterr().out
