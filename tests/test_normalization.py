"""Trained weights meet their images standardized as they were trained, in every command that runs them.

A run trained with ``--normalize imagenet`` is evaluated, probed, linearly probed and shown with
ImageNet's statistics again (its ``run.json`` says so), the authors' checkpoints and the builds
imported from them with ImageNet's (as every vision family trained), other weights with the data's
own; ``--normalize`` overrides, and ImageNet's statistics on images that are not RGB are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from crate_compose.assessment.layer_probes import probe
from crate_compose.assessment.run_probes import load_weights, normalization_of, probe_run, standardize
from crate_compose.assessment.scoring import evaluate_weights, linear_probe_weights
from crate_compose.building.builder import compile_spec
from crate_compose.cli import main
from crate_compose.data.batches import IMAGENET_MEAN, IMAGENET_STD, renormalize
from crate_compose.data.sets import load_data
from crate_compose.pictures.show import show
from crate_compose.pictures.views import display
from crate_compose.tasks.held_out import probe_sample
from crate_compose.training.run import Settings, train

pytestmark = pytest.mark.usefixtures("one_thread")
SPEC = "specs/crate-digits.yaml"


@pytest.fixture(scope="module")
def tinted(tmp_path_factory) -> Path:
    """Digits 0-2 as tinted RGB images (far from ImageNet's mean colour), a folder per class."""
    from PIL import Image
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("tinted")
    digits = load_digits()
    for label in (0, 1, 2):
        (root / f"class{label}").mkdir()
        for i, image in enumerate(digits.images[digits.target == label][:50]):
            grey = (image * 255 / 16).astype(np.uint8)
            rgb = np.stack([grey, (grey * 0.6).astype(np.uint8), 255 - grey], -1)
            Image.fromarray(rgb).save(root / f"class{label}/{i}.png")
    return root


@pytest.fixture(scope="module")
def run(tinted, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("normalized") / "run"
    train(SPEC, Settings(data=f"folder:{tinted}", steps=30, batch_size=32, normalize="imagenet"), out=out)
    return out


def test_evaluate_gives_the_runs_own_test_metrics(run, tinted, capsys):
    final = json.loads((run / "result.json").read_text())["metrics"]
    assert (
        main(
            [
                "evaluate",
                str(run / "final" / "spec.yaml"),
                "--weights",
                str(run / "final"),
                "--data",
                f"folder:{tinted}",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert answer["normalize"] == "imagenet" and f"as the run {run} was trained" in captured.err
    assert answer["test_accuracy"] == final["test_accuracy"]
    assert answer["test_loss"] == pytest.approx(final["test_loss"], rel=1e-6)
    other = evaluate_weights(run / "final" / "spec.yaml", f"folder:{tinted}", run / "final", normalize="data")
    assert other["normalize"] == "data" and other["test_loss"] != pytest.approx(final["test_loss"], rel=1e-3)


def test_probe_and_linear_probe_standardize_as_the_run(run, tinted):
    notes: list[str] = []
    _, _, runs = probe_run(run, out=run.parent / "probes", notes=notes.append, logger="none")
    assert any("standardized with ImageNet's statistics" in note for note in notes)
    spec = run / "final" / "spec.yaml"
    from crate_compose.training.preparation import prepare

    fitted, data = prepare(spec, f"folder:{tinted}")
    model = compile_spec(fitted)
    load_weights(model, run / "final")
    raw, _ = probe_sample(data, 256)
    by_hand = (
        raw * torch.tensor(data.std).view(1, -1, 1, 1)
        + torch.tensor(data.mean).view(1, -1, 1, 1)
        - torch.tensor(IMAGENET_MEAN).view(1, -1, 1, 1)
    ) / torch.tensor(IMAGENET_STD).view(1, -1, 1, 1)
    assert torch.allclose(renormalize(raw, data, "imagenet"), by_hand, atol=1e-6)
    expected = probe(model, by_hand.float())
    assert [r["value"] for r in runs["trained"]] == pytest.approx([r["value"] for r in expected], rel=1e-5)
    answer = linear_probe_weights(spec, f"folder:{tinted}", run / "checkpoints" / "step-000030")
    assert answer["normalize"] == "imagenet"


def test_show_feeds_imagenets_statistics_and_draws_the_images_as_they_are(run, tinted, tmp_path, monkeypatch):
    """The network sees the images standardized as it was trained; the pictures show the data's pixels
    (``show`` undoes ImageNet's statistics, not the data's)."""
    from crate_compose.pictures import show as pictures
    from crate_compose.training.preparation import prepare

    seen = []
    real = pictures.look
    monkeypatch.setattr(
        pictures, "look", lambda model, inputs, **kw: seen.append((inputs, kw)) or real(model, inputs, **kw)
    )
    shown = show(
        run / "final" / "spec.yaml", f"folder:{tinted}", weights=run / "final", out=tmp_path / "pictures", images=2
    )
    assert shown.files and all(path.is_file() for path, _ in shown.files)
    _, data = prepare(run / "final" / "spec.yaml", f"folder:{tinted}")
    chosen = [0, len(data.test) // 2]
    own = torch.stack([data.test[i][0] for i in chosen])
    pixels = own * torch.tensor(data.std).view(1, -1, 1, 1) + torch.tensor(data.mean).view(1, -1, 1, 1)
    imagenet = (pixels - torch.tensor(IMAGENET_MEAN).view(1, -1, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, -1, 1, 1)
    ((inputs, given),) = seen
    assert torch.allclose(inputs, imagenet, atol=1e-5)
    assert torch.allclose(display(inputs, given["mean"], given["std"]).float(), pixels.clamp(0, 1), atol=1e-5)


def test_where_the_weights_come_from_says_the_statistics(run, tmp_path):
    assert normalization_of(run / "final") == ("imagenet", f"--normalize imagenet: as the run {run} was trained")
    assert normalization_of(run / "checkpoints" / "step-000030")[0] == "imagenet"
    assert normalization_of(run / "final", "data") == ("data", None)
    assert normalization_of(None) == ("data", None)
    authors = tmp_path / "crate.pth"
    torch.save({"state_dict": {}}, authors)
    assert normalization_of(authors)[0] == "imagenet"
    assert standardize(authors, None, load_data("digits")) == "data"  # inferred: grey images keep their own
    build = tmp_path / "build"
    build.mkdir()
    (build / "spec.yaml").write_text((run / "final" / "spec.yaml").read_text())
    tensors = load_file(run / "final" / "model.safetensors")
    save_file(tensors, build / "model.safetensors", metadata={"format": "pt"})
    assert normalization_of(build) == ("data", None)  # a build of this package's own, not of a run
    save_file(
        tensors,
        build / "model.safetensors",
        metadata={"format": "pt", "imported_from": "crate-s.pth", "family": "crate"},
    )
    chosen, note = normalization_of(build)
    assert chosen == "imagenet" and "imported from crate-s.pth" in note


@pytest.mark.parametrize("command", ["evaluate", "linear-probe", "show", "probe"])
def test_imagenets_statistics_on_grey_images_are_refused(command, run, tmp_path, capsys):
    args = [command, SPEC, "--weights", str(run / "final"), "--data", "digits", "--normalize", "imagenet"]
    if command in ("show", "probe"):
        args += ["--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "'digits' has 1 channel" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_text_data_is_never_standardized():
    data = load_data("text")
    tokens = data.test[0][0][None]
    assert renormalize(tokens, data, "imagenet") is tokens


def test_a_run_folder_stands_for_its_weights_spec_and_data(run, tinted, tmp_path, capsys):
    """``evaluate RUN``, ``linear-probe RUN`` and ``show RUN`` as ``probe RUN``: the run's final weights,
    spec, data and standardization; its own test metrics come back; other data is refused."""
    final = json.loads((run / "result.json").read_text())["metrics"]
    assert main(["evaluate", str(run)]) == 0
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert f"{run}: evaluating its final/, with its spec, on folder:{tinted}" in captured.err
    assert (answer["test_accuracy"], answer["weights"]) == (final["test_accuracy"], str(run / "final"))
    assert main(["evaluate", str(run), "--workers", "2"]) == 0  # the folder decoded in two processes: the same
    assert json.loads(capsys.readouterr().out) == answer
    assert main(["linear-probe", str(run)]) == 0
    probed = json.loads(capsys.readouterr().out)
    assert probed["normalize"] == "imagenet"
    assert main(["linear-probe", str(run), "--workers", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == probed
    assert main(["show", str(run), "--images", "1", "--out", str(tmp_path / "pictures")]) == 0
    assert "wrote" in capsys.readouterr().out
    for command in ("evaluate", "linear-probe", "show"):
        assert main([command, str(run), "--data", "digits"]) == 2
        err = capsys.readouterr().err
        assert f"the run {run} was trained on folder:{tinted}" in err and "Traceback" not in err
    assert main(["evaluate", SPEC]) == 2
    assert "evaluate needs trained weights" in capsys.readouterr().err
