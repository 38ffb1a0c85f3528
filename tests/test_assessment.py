"""``evaluate`` and ``linear-probe`` on a CRATE trained here on digits, against scikit-learn and
torch run by hand on the same features and outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import fx

from crate_compose.assessment.run_probes import load_weights
from crate_compose.assessment.scoring import evaluate_weights, linear_probe_weights, tensors_of
from crate_compose.building.builder import compile_spec
from crate_compose.cli import main
from crate_compose.errors import WorkbenchError
from crate_compose.tasks.frozen_features import C_GRID, features, knn
from crate_compose.training.preparation import prepare
from crate_compose.training.run import Settings, train

DIGITS = "specs/crate-digits.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("assessment") / "run"
    train(DIGITS, Settings(steps=120, batch_size=64), out=run)
    spec, data = prepare(DIGITS, "digits")
    model = compile_spec(spec)
    load_weights(model, run / "final")
    return run / "final", model, data


def _by_hand_tokens(model: fx.GraphModule, inputs: torch.Tensor, target: str) -> torch.Tensor:
    """The output of the node calling ``target``, from an fx interpreter (no hooks)."""
    found = {}

    class Keep(fx.Interpreter):
        def call_module(self, name, args, kwargs):
            out = super().call_module(name, args, kwargs)
            if name == target:
                found["tokens"] = out
            return out

    model.eval()
    with torch.no_grad():
        Keep(model).run(inputs)
    return found["tokens"]


def test_features_are_the_class_token_or_the_mean_of_the_last_encoder_step(trained):
    _, model, data = trained
    inputs, _ = tensors_of(data.test)
    last = [n for n in model.graph.nodes if n.op == "call_module" and n.meta.get("role") == "encoder"][-1].target
    tokens = _by_hand_tokens(model, inputs[:50], last).double()
    assert torch.allclose(features(model, inputs[:50]), tokens[:, 0], atol=1e-12)
    assert torch.allclose(features(model, inputs[:50], pool="mean"), tokens.mean(1), atol=1e-12)
    layer0 = [n for n in model.graph.nodes if n.op == "call_module" and n.meta.get("layer") == 0][-1].target
    assert torch.allclose(
        features(model, inputs[:50], layer=0), _by_hand_tokens(model, inputs[:50], layer0)[:, 0].double()
    )
    model.train()
    features(model, inputs[:4])
    assert model.training  # the mode it was found in
    with pytest.raises(WorkbenchError, match="--layer 9: the encoder has layers 0..3"):
        features(model, inputs[:4], layer=9)
    with pytest.raises(WorkbenchError, match="--pool max"):
        features(model, inputs[:4], pool="max")


def test_the_linear_probe_is_scikit_learn_with_c_chosen_on_a_validation_fifth(trained):
    weights, model, data = trained
    result = linear_probe_weights(DIGITS, "digits", weights, baseline=False)  # the trained network alone
    (train_x, train_y), (test_x, test_y) = tensors_of(data.train), tensors_of(data.test)
    _agrees_with_scikit_learn(result, model, train_x, train_y, test_x, test_y)
    assert result["test_accuracy"] > 0.9 and (result["train"], result["test"], result["dim"]) == (1437, 360, 64)


def test_a_masked_autoencoder_on_photos_is_probed_on_which_photo_a_crop_comes_from(tmp_path):
    """CRATE-MAE trained on crops of two photographs: unlabelled, so the probe's class is the photo."""
    mae = "zoo/crate-mae-photos.yaml"
    train(mae, Settings(steps=20, batch_size=32, task="mae", data="photos"), out=tmp_path / "run")
    result = linear_probe_weights(mae, "photos", tmp_path / "run" / "final")
    spec, data = prepare(mae, "photos")
    model = compile_spec(spec)
    load_weights(model, tmp_path / "run" / "final")
    (train_x, _), (test_x, _) = tensors_of(data.train), tensors_of(data.test)
    train_y, test_y = data.train.crops[:, 0], data.test.crops[:, 0]
    assert set(train_y.tolist()) == {0, 1} and result["labels"] == "the photograph of each crop"
    _agrees_with_scikit_learn(result, model, train_x, train_y, test_x, test_y)
    assert result["knn_accuracy"] == pytest.approx(
        knn(features(model, train_x), train_y, features(model, test_x), test_y)
    )


def _agrees_with_scikit_learn(result, model, train_x, train_y, test_x, test_y):
    """The probe's C, validation scores and test accuracy equal scikit-learn's run by hand on the same features."""
    train_f, test_f = features(model, train_x).numpy(), features(model, test_x).numpy()
    fit_x, val_x, fit_y, val_y = train_test_split(
        train_f, train_y.numpy(), test_size=0.2, random_state=0, stratify=train_y.numpy()
    )

    def fitted(c, x, y):
        scaler = StandardScaler().fit(x)
        return scaler, LogisticRegression(C=c, max_iter=2000, random_state=0).fit(scaler.transform(x), y)

    scores = {}
    for c in [1, 10, 100, 1_000, 10_000, 100_000]:
        scaler, classifier = fitted(c, fit_x, fit_y)
        scores[c] = classifier.score(scaler.transform(val_x), val_y)
    best = min(c for c in scores if scores[c] == max(scores.values()))
    scaler, classifier = fitted(best, train_f, train_y.numpy())
    assert result["c"] == best and list(C_GRID) == [1.0, 10.0, 100.0, 1e3, 1e4, 1e5]
    assert result["validation_accuracy"] == pytest.approx({f"{float(c):g}": s for c, s in scores.items()})
    assert result["test_accuracy"] == pytest.approx(classifier.score(scaler.transform(test_f), test_y.numpy()))


def _knn_by_hand(train_f, train_y, test_f, k=20, t=0.07):
    train_n = train_f / np.linalg.norm(train_f, axis=1, keepdims=True)
    predictions = []
    for row in test_f / np.linalg.norm(test_f, axis=1, keepdims=True):
        similarity = train_n @ row
        nearest = np.argsort(-similarity, kind="stable")[:k]
        votes = {}
        for i in nearest:
            votes[train_y[i]] = votes.get(train_y[i], 0.0) + np.exp(similarity[i] / t)
        predictions.append(max(votes, key=votes.get))
    return np.array(predictions)


def test_knn_is_dinos_weighted_vote(trained):
    weights, model, data = trained
    (train_x, train_y), (test_x, test_y) = tensors_of(data.train), tensors_of(data.test)
    train_f, test_f = features(model, train_x), features(model, test_x)
    expected = (_knn_by_hand(train_f.numpy(), train_y.numpy(), test_f.numpy()) == test_y.numpy()).mean()
    assert knn(train_f, train_y, test_f, test_y) == pytest.approx(expected)
    assert linear_probe_weights(DIGITS, "digits", weights)["knn_accuracy"] == pytest.approx(expected)


def test_evaluate_gives_top1_top5_and_the_loss_of_the_weights(trained):
    weights, model, data = trained
    result = evaluate_weights(DIGITS, "digits", weights)
    inputs, labels = tensors_of(data.test)
    model.eval()
    with torch.no_grad():
        logits = model(inputs)["output"]
    top1 = (logits.argmax(-1) == labels).double().mean().item()
    top5 = (logits.topk(5, -1).indices == labels[:, None]).any(-1).double().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    assert result["test_accuracy"] == pytest.approx(top1) and result["test_top5"] == pytest.approx(top5)
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5) and result["examples"] == 360


def test_the_commands_print_json_and_refuse_clearly(trained, tmp_path, capsys):
    weights, _, _ = trained
    assert main(["evaluate", DIGITS, "--weights", str(weights), "--out", str(tmp_path / "e.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "e.json").read_text()) and printed["task"] == "classify"
    assert main(["linear-probe", DIGITS, "--weights", str(weights), "--pool", "mean", "--layer", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["layer"] == 1
    assert main(["evaluate", DIGITS, "--weights", str(tmp_path / "nowhere")]) == 2
    assert "no model.safetensors there" in capsys.readouterr().err
    assert main(["linear-probe", DIGITS, "--weights", str(weights), "--layer", "7"]) == 2
    assert "--layer 7: the encoder has layers 0..3" in capsys.readouterr().err


def test_the_probe_keeps_the_heads_classes_of_the_weights(tmp_path):
    """The papers probe an ImageNet network on other data: the head (unused) keeps the weights' classes,
    here a checkpoint of 1,000 classes in the authors' layout probed on a folder of 2."""
    from PIL import Image
    from reference.authors import state_dict
    from sklearn.datasets import load_digits

    digits = load_digits()
    for label in (0, 1):
        (tmp_path / f"digit{label}").mkdir()
        for i, image in enumerate(digits.images[digits.target == label][:30]):
            Image.fromarray((image * 255 / 16).astype(np.uint8)).convert("RGB").save(tmp_path / f"digit{label}/{i}.png")
    sizes = dict(image_size=8, channels=3, patch_size=4, d=32, depth=2, heads=2, head_dim=16, classes=1000)
    torch.save({"state_dict": state_dict("crate", sizes, dtype=torch.float32)}, tmp_path / "crate.pth")
    overrides = [
        "sizes.channels=3",
        "sizes.classes=1000",
        "sizes.patch_size=4",
        "sizes.d=32",
        "sizes.heads=2",
        "sizes.depth=2",
        "preprocess.patch_embed.args.norm=true",
    ]
    result = linear_probe_weights(DIGITS, f"folder:{tmp_path}", tmp_path / "crate.pth", overrides=overrides)
    assert result["labels"] == "classes" and result["dim"] == 32 and result["train"] + result["test"] == 60
    assert result["test_accuracy"] > 0.7


def test_a_choice_of_c_that_the_validation_cannot_make_is_said():
    """Features that separate the training data (a network's own) tie every C at 1.0: the result says so."""
    from crate_compose.tasks.frozen_features import linear_probe

    generator = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    separable = np.eye(3)[labels] * 10 + generator.normal(0, 0.01, (120, 3))
    result = linear_probe(separable, labels, separable[:30], labels[:30])
    assert result.c == 1.0 and set(result.validation_accuracy.values()) == {1.0}
    assert "6 of 6 values of C tie at validation accuracy 1.0000" in result.choice
