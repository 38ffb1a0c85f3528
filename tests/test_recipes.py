"""Training recipes (``train --config``): read like specs with every mistake located, the command line
winning, the text kept in the run folder, and each shipped recipe running a few steps and resuming exactly."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from runfiles import snapshot, train_losses
from safetensors.torch import load_file

from crate_compose.cli import main
from crate_compose.training.recipes import RecipeError, read_recipe, shipped

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")

# a spec, its data and small sizes per shipped recipe (the recipes are the papers' ImageNet settings)
RUNS = {
    "crate-pretrain": (
        "specs/crate-digits.yaml",
        "digits",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"],
    ),
    "crate-finetune": (
        "specs/crate-digits.yaml",
        "digits",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"],
    ),
    "crate-mae-pretrain": (
        "zoo/crate-mae-photos.yaml",
        "photos",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"],
    ),
    "crate-mae-finetune": (
        "specs/crate-digits.yaml",
        "digits",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"],
    ),
    "crate-dino": (
        "zoo/crate-dino-digits.yaml",
        "digits",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", "sizes.prototypes=32"],
    ),
    "simdino": (
        "zoo/crate-simdino-digits.yaml",
        "digits",
        ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", "sizes.features=16"],
    ),
    "tost": (
        "zoo/tost-tiny.yaml",
        "digits",
        [
            "sizes.d=16",
            "sizes.heads=2",
            "sizes.depth=1",
            "sizes.class_depth=1",
            "sizes.patch_size=8",
            "sizes.image_size=16",
        ],
    ),
}


def test_every_shipped_recipe_is_read_and_has_a_run_here():
    assert set(shipped()) == set(RUNS)
    for name in shipped():
        recipe = read_recipe(name)
        assert recipe.description and recipe.settings["optimizer"] in ("adamw", "lion")


def test_the_papers_numbers():
    pretrain = read_recipe("crate-pretrain").settings
    assert (
        pretrain["optimizer"],
        pretrain["lr"],
        pretrain["weight_decay"],
        pretrain["label_smoothing"],
        pretrain["batch_size"],
        pretrain["epochs"],
        pretrain["warmup_epochs"],
    ) == ("lion", 2.4e-4, 0.5, 0.1, 2048, 150, 5)
    finetune = read_recipe("crate-finetune").settings
    assert (finetune["optimizer"], finetune["lr"], finetune["weight_decay"], finetune["augment"]) == (
        "adamw",
        5e-5,
        0.01,
        "randaugment",
    )


def test_a_recipe_with_mistakes_is_refused_with_every_one_located(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text("optimizer: adam\nlr: -1\nlearning_rate: 3\naccumulate: 3\n")
    with pytest.raises(RecipeError) as error:
        read_recipe(path)
    lines = str(error.value).splitlines()
    assert lines[0] == "4 problems in the recipe:"
    assert f"{path}:1:1: optimizer: 'adam' is not one of: adamw, lion, sgd" in lines[1]
    assert f"{path}:3:1: learning_rate: unknown key 'learning_rate'" in lines[3]
    out = tmp_path / "run"
    assert main(["train", "specs/crate-digits.yaml", "--config", str(path), "--out", str(out)]) == 2
    assert not out.exists() and "Traceback" not in capsys.readouterr().err


def test_a_recipe_that_is_not_yaml_of_settings_is_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("!!python/object/apply:os.system [echo hi]\n")
    with pytest.raises(RecipeError):
        read_recipe(path)
    with pytest.raises(RecipeError, match="did you mean 'crate-pretrain'"):
        read_recipe("crate-pretrian")


def _train(name: str, out: Path, *extra: str, device: torch.device | str = "cpu") -> int:
    spec, data, sets = RUNS[name]
    args = [
        "train",
        str(ROOT / spec),
        "--config",
        name,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "2",
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        str(device),
        *[a for s in sets for a in ("--set", s)],
        *extra,
    ]
    if name != "crate-mae-pretrain":
        args += ["--image-size", "16"]
    return main(args)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_recipe_runs_a_few_steps_and_resumes_exactly(tmp_path, name, device):
    assert _train(name, tmp_path / "whole", device=device) == 0
    assert (tmp_path / "whole" / "recipe.yaml").read_text() == read_recipe(name).text
    assert _train(name, tmp_path / "broken", device=device) == 0
    broken = tmp_path / "broken"
    (
        shutil.rmtree(broken / "checkpoints/step-000004"),
        shutil.rmtree(broken / "final"),
        (broken / "result.json").unlink(),
    )
    if (broken / "final-ema").exists():
        shutil.rmtree(broken / "final-ema")
    assert _train(name, broken, "--resume", device=device) == 0
    a, b = load_file(tmp_path / "whole/final/model.safetensors"), load_file(broken / "final/model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
    assert train_losses(tmp_path / "whole") == train_losses(broken)


def test_the_command_line_wins_and_a_resume_that_differs_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train("crate-pretrain", run, "--lr", "1e-3") == 0
    assert '"lr": 0.001' in (run / "run.json").read_text() and '"optimizer": "lion"' in (run / "run.json").read_text()
    before = snapshot(run)
    assert _train("crate-pretrain", run, "--resume", "--steps", "6") == 2  # the recipe's lr, not the run's
    assert "settings.lr: 0.001 in the run, 0.00024 now" in capsys.readouterr().err
    assert snapshot(run) == before


def test_the_crate_recipe_trains_from_a_folder_laid_out_as_cifar10(tmp_path):
    """train/<class>/*.png and test/<class>/*.png at 32x32, written here: the recipe's augmentation in 2 workers."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from folder_run import write_folder

    data = tmp_path / "cifar-layout"
    assert write_folder(data) == (1437, 360)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "crate-tiny",
            "--config",
            "crate-pretrain",
            "--data",
            f"folder:{data}",
            "--image-size",
            "32",
            "--set",
            "sizes.patch_size=8",
            "--set",
            "sizes.depth=1",
            "--steps",
            "3",
            "--batch-size",
            "16",
            "--workers",
            "2",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    record = (out / "run.json").read_text()
    assert '"optimizer": "lion"' in record and '"augment": "crop-flip"' in record
    assert (out / "final" / "model.safetensors").is_file()
