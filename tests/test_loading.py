"""The data pipeline (data/batches.py): batches made in DataLoader workers equal those made in the
training process, augmentations seeded by (seed, step, position), exact resume with workers, soft targets."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from crate_compose import tasks
from crate_compose.data.batches import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Examples,
    StepBatches,
    batch_indices,
    batches,
    renormalize,
)
from crate_compose.data.sets import load_data
from crate_compose.errors import DataError, TrainError
from crate_compose.settings import Settings
from crate_compose.tasks import settings_problems
from crate_compose.training.run import train

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]


@pytest.fixture(scope="module")
def digits():
    return load_data("digits")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two classes of JPEGs of different sizes (resized to 16x16): decoded and cropped at their own size."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for i in range(10):
            height, width = 20 + 2 * i, 24 + i
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.jpg")
    return load_data(f"folder:{root}", image_size=16)


def _all(data, settings, start=0):
    return list(batches(data, settings, start))


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"augment": "shift"},
        {"augment": "crop-flip"},
        {"augment": "randaugment", "mixup": 0.8, "cutmix": 1.0},
    ],
    ids=["none", "shift", "crop-flip", "randaugment-mix"],
)
def test_workers_give_the_batches_of_the_training_process(digits, options):
    settings = Settings(steps=6, batch_size=16, seed=5, **options)
    in_process = _all(digits, settings)
    assert len(in_process) == 6 and in_process[0][0].shape == (16, 1, 8, 8)
    assert _same(in_process, _all(digits, replace(settings, workers=2)))
    assert _same(in_process[2:], _all(digits, replace(settings, workers=1), start=2))  # a resumed run's batches


def test_folder_images_are_decoded_in_workers_as_in_process(folder):
    for augment in ("none", "crop-flip", "randaugment"):
        settings = Settings(steps=3, batch_size=8, augment=augment, data="folder")
        in_process = _all(folder, settings)
        assert in_process[0][0].shape == (8, 3, 16, 16)
        assert _same(in_process, _all(folder, replace(settings, workers=2)))


def test_plain_batches_are_the_examples_of_batch_indices(digits):
    settings = Settings(steps=92, batch_size=16)  # 89 batches an epoch: steps 87-92 cross into the second
    for step, (x, y) in enumerate(_all(digits, settings, start=86), start=87):
        indices = batch_indices(step, len(digits.train), settings)
        assert torch.equal(x, digits.train.inputs[indices]) and torch.equal(y, digits.train.targets[indices])


def test_each_process_of_torchrun_takes_its_share_at_its_places_in_the_global_batch():
    settings = Settings(steps=95, batch_size=12)
    shares = [list(StepBatches(100, settings, 80, rank, 3)) for rank in range(3)]
    for k, step in enumerate(range(81, 96)):
        whole = batch_indices(step, 100, settings).tolist()
        assert [item for share in shares for item in share[k]] == [(step, i, whole[i]) for i in range(12)]


@pytest.mark.parametrize("augment", ["crop-flip", "randaugment"])
def test_augmentations_change_images_the_same_way_per_step_and_differently_across_steps(digits, folder, augment):
    for data in (digits, folder):
        plain = Examples(data, Settings())
        examples = Examples(data, Settings(augment=augment, seed=1))
        changed = sum(
            not torch.allclose(examples.example(1, i, i), plain.example(1, i, i), atol=1e-5) for i in range(8)
        )
        assert changed >= 6  # a crop of the whole image unflipped (and no colour op) leaves it as it was
        assert torch.equal(examples.example(3, 5, 2), examples.example(3, 5, 2))  # deterministic per step
        assert torch.equal(
            examples.example(3, 5, 2), Examples(data, Settings(augment=augment, seed=1)).example(3, 5, 2)
        )
        assert not torch.equal(examples.example(3, 5, 2), examples.example(4, 5, 2))  # another step
        assert not torch.equal(examples.example(3, 5, 2), examples.example(3, 6, 2))  # another place in the batch
        assert not torch.equal(
            examples.example(3, 5, 2), Examples(data, Settings(augment=augment, seed=2)).example(3, 5, 2)
        )
    x, _ = _all(digits, Settings(steps=1, batch_size=16, augment=augment))[0]
    assert x.isfinite().all() and x.shape == (16, 1, 8, 8)


def test_the_training_process_keeps_its_own_random_state(digits):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    _all(digits, Settings(steps=2, batch_size=8, augment="randaugment", mixup=0.5))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("mix", [{"mixup": 0.8}, {"cutmix": 1.0}, {"mixup": 0.8, "cutmix": 1.0}])
def test_mixup_and_cutmix_make_soft_targets_that_sum_to_one(digits, mix):
    settings = Settings(steps=4, batch_size=16, seed=2, **mix)
    plain = _all(digits, Settings(steps=4, batch_size=16, seed=2))
    mixed = _all(digits, settings)
    for (_x, y), (_x0, y0) in zip(mixed, plain):
        assert y.dtype == torch.float32 and y.shape == (16, 10)
        assert torch.allclose(y.sum(1), torch.ones(16)) and (y >= 0).all()
        rows, partner = torch.arange(16), y0.roll(1)  # each image is mixed with the one before it
        shares = y[rows, y0] + torch.where(partner == y0, 0, y[rows, partner])
        assert torch.allclose(shares, torch.ones(16))  # the two labels hold all of it
    assert sum(not torch.equal(x, x0) for (x, _), (x0, _) in zip(mixed, plain)) >= 3  # (a cut may be empty)
    assert any((y.max(1).values < 1).any() for _, y in mixed)  # soft, not one-hot


def test_the_classification_loss_takes_soft_targets_with_label_smoothing():
    logits = torch.randn(4, 5)
    hard = torch.tensor([0, 3, 1, 4])
    assert torch.allclose(
        tasks.get("classify").loss({"output": logits}, None, F.one_hot(hard, 5).float(), model=None, smoothing=0.1),
        tasks.get("classify").loss({"output": logits}, None, hard, model=None, smoothing=0.1),
    )
    soft = torch.softmax(torch.randn(4, 5), 1)
    smoothed = soft * 0.9 + 0.1 / 5
    expected = -(smoothed * torch.log_softmax(logits, 1)).sum(1).mean()
    assert torch.allclose(
        tasks.get("classify").loss({"output": logits}, None, soft, model=None, smoothing=0.1), expected
    )


def test_imagenet_normalization_standardizes_train_and_test_alike(folder):
    settings = Settings(steps=1, batch_size=8, normalize="imagenet")
    ((x, _),) = _all(folder, settings)
    indices = batch_indices(1, len(folder.train), settings)
    pixels = torch.stack([folder.train.raw(int(i)) for i in indices])
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(x, (pixels - mean) / std, atol=1e-5)
    test = torch.stack([folder.test[i][0] for i in range(2)])
    raw = torch.stack([folder.test.raw(i) for i in range(2)])
    assert torch.allclose(renormalize(test, folder, settings.normalize), (raw - mean) / std, atol=1e-5)
    assert renormalize(test, folder, "data") is test


def test_settings_and_data_that_do_not_fit_are_refused(tmp_path, digits):
    assert [name for name, _ in settings_problems(Settings(task="mae", mixup=0.8))] == ["mixup"]
    assert [name for name, _ in settings_problems(Settings(workers=-1, cutmix=float("nan"), normalize="x"))] == [
        "workers",
        "cutmix",
        "normalize",
    ]
    refusals = [
        (Settings(task="lm", data="text", augment="crop-flip"), "'text' is not images"),
        (Settings(data="digits", normalize="imagenet"), "'digits' has 1 channel"),
        (Settings(task="mae", data="photos", cutmix=1.0), None),  # refused by the settings' rules
    ]
    for settings, message in refusals:
        with pytest.raises(TrainError, match=message or "cutmix"):
            train(
                DIGITS if settings.task != "lm" else "specs/tost-lm.yaml",
                replace(settings, steps=1),
                overrides=TINY if settings.task == "classify" else [],
                out=tmp_path / "never",
                progress=False,
            )
        assert not (tmp_path / "never").exists()


def _noise_folder(root: Path, per_class: int, side: int, seed: int) -> None:
    """Two class folders of ``per_class`` random RGB PNGs of ``side`` x ``side``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")


def test_a_bad_image_met_in_a_worker_is_named(tmp_path):
    _noise_folder(tmp_path, 5, 24, seed=1)
    data = load_data(f"folder:{tmp_path}")
    broken = data.train.files[3]
    broken.write_bytes(broken.read_bytes()[:400])  # the header reads, the pixels do not
    settings = Settings(steps=2, batch_size=len(data.train), augment="crop-flip", workers=1)
    with pytest.raises(DataError, match=str(broken.name)) as caught:
        _all(data, settings)
    assert "Traceback" not in str(caught.value)


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "train"}


def test_a_run_resumed_with_other_workers_equals_the_uninterrupted_one(tmp_path):
    settings = Settings(
        steps=8,
        batch_size=16,
        lr=2e-3,
        log_every=1,
        checkpoint_every=4,
        augment="randaugment",
        mixup=0.8,
        cutmix=1.0,
        label_smoothing=0.1,
        workers=2,
    )
    run = tmp_path / "run"
    train(DIGITS, settings, overrides=TINY, out=run, progress=False)
    losses, weights = _losses(run), load_file(run / "final" / "model.safetensors")
    assert len(losses) == 8
    train(DIGITS, replace(settings, workers=1), overrides=TINY, out=run, resume_from=4, progress=False)
    assert _losses(run) == losses  # steps 5-8 again, from the checkpoint of step 4, with another worker count
    resumed = load_file(run / "final" / "model.safetensors")
    assert all(torch.equal(weights[name], resumed[name]) for name in weights)
    assert "workers" not in json.loads((run / "run.json").read_text())["identity"]["settings"]


def test_a_split_read_in_workers_is_the_split_read_here_and_a_bad_image_is_named(tmp_path):
    """``split_batches`` (evaluation, the linear probe): the same batches in order with 0 or 2 workers; a
    bad image met in a worker is a DataError naming the file, not a worker's traceback."""
    from crate_compose.data.batches import split_batches

    _noise_folder(tmp_path, 9, 20, seed=2)
    data = load_data(f"folder:{tmp_path}")
    here, there = list(split_batches(data.train, 4)), list(split_batches(data.train, 4, workers=2))
    assert [len(x) for x, _ in here] == [4, 4, 4, 2] and len(here) == len(there)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(here, there))
    assert [len(x) for x, _ in split_batches(data.train, 4, workers=2, count=5)] == [4, 1]
    broken = data.train.files[5]
    broken.write_bytes(broken.read_bytes()[:400])
    with pytest.raises(DataError, match=str(broken.name)) as caught:
        list(split_batches(data.train, 4, workers=2))
    assert "Traceback" not in str(caught.value)
