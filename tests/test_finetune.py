"""Fine-tuning (train --init DIR [--freeze encoder]): tensors copied by name, a head of another size left
new with a note, anything else that does not fit refused before anything is written, a masked
autoencoder's encoder under a classifier head, the init and the freeze in the run's identity, exact resume."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from runfiles import snapshot, train_losses
from safetensors.torch import load_file

import crate_compose as cc
from crate_compose import cli
from crate_compose.building.builder import compile_spec
from crate_compose.errors import TrainError, WorkbenchError
from crate_compose.training import finetune
from crate_compose.training.preparation import prepare
from crate_compose.training.run import Settings, train

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
MAE = str(ROOT / "zoo" / "crate-mae-photos.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SETS = [arg for o in TINY for arg in ("--set", o)]


def _images(folder: Path, classes: int, side: int, seed: int, count: int = 6) -> str:
    """A folder of random RGB images in ``classes`` class folders; returns its --data name."""
    from PIL import Image

    rng = torch.Generator().manual_seed(seed)
    for c in range(classes):
        (folder / f"class{c}").mkdir(parents=True)
        for i in range(count):
            pixels = torch.randint(0, 256, (side, side, 3), generator=rng, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(folder / f"class{c}" / f"{i}.png")
    return f"folder:{folder}"


def _train(
    capsys, out: Path, data: str, *extra: str, spec: str = DIGITS, sets=SETS, steps: int = 4, status: int = 0
) -> str:
    """Run ``train`` in this process; return what it printed (stdout, then stderr)."""
    capsys.readouterr()
    code = cli.main(
        [
            "train",
            spec,
            *sets,
            "--data",
            data,
            "--steps",
            str(steps),
            "--batch-size",
            "4",
            "--log-every",
            "1",
            "--no-progress",
            "--out",
            str(out),
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    assert code == status, err
    assert "Traceback" not in err
    return out + err


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Two image sets of 8x8 RGB images: one of 2 classes (pre-training), one of 3 (fine-tuning)."""
    root = tmp_path_factory.mktemp("images")
    return {"two": _images(root / "two", 2, 8, seed=0), "three": _images(root / "three", 3, 8, seed=1)}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, folders) -> Path:
    """A tiny CRATE trained 4 steps on 2 classes: its final/ is the build fine-tuning starts from."""
    run = tmp_path_factory.mktemp("pretrained") / "run"
    assert (
        cli.main(
            [
                "train",
                DIGITS,
                *SETS,
                "--data",
                folders["two"],
                "--steps",
                "4",
                "--batch-size",
                "4",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    return run / "final"


def test_another_number_of_classes_keeps_everything_but_the_head(pretrained, folders, tmp_path, capsys):
    before = snapshot(pretrained)
    init = _weights(pretrained)
    # before the first step: every tensor but the head's is the init's, the head is the fresh one
    spec, _ = prepare(DIGITS, folders["three"], TINY)
    model = compile_spec(spec, seed=0)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    notes = finetune.apply_init(model, finetune.read_init(pretrained))
    for name, tensor in model.state_dict().items():
        expected = fresh[name] if name.startswith("head.classify.classifier") else init[name]
        assert torch.equal(tensor, expected), name
    assert notes == [
        f"head.classify.classifier.weight is (3, 16) here, (2, 16) in {pretrained}: left newly initialized",
        f"head.classify.classifier.bias is (3,) here, (2,) in {pretrained}: left newly initialized",
    ]
    # the command says so, trains, and leaves the init as it was
    err = _train(capsys, tmp_path / "run", folders["three"], "--init", str(pretrained))
    assert (
        f"note: head.classify.classifier.weight is (3, 16) here, (2, 16) in {pretrained}: left newly initialized" in err
    )
    assert "not used" not in err  # every tensor of the init is used or replaced
    final = _weights(tmp_path / "run" / "final")
    assert final["head.classify.classifier.weight"].shape == (3, 16)
    assert snapshot(pretrained) == before
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["identity"]["init"] == {
        "path": str(pretrained.resolve()),
        "sha256": hashlib.sha256((pretrained / "model.safetensors").read_bytes()).hexdigest(),
    }
    assert "freeze" not in record["identity"]


def test_freeze_encoder_trains_the_head_alone(pretrained, folders, tmp_path, capsys):
    printed = _train(capsys, tmp_path / "run", folders["three"], "--init", str(pretrained), "--freeze", "encoder")
    final, init = _weights(tmp_path / "run" / "final"), _weights(pretrained)
    head = [name for name in final if name.startswith("head.")]
    assert head and all(torch.equal(final[name], init[name]) for name in final if name not in head)
    spec, _ = prepare(DIGITS, folders["three"], TINY)
    fresh = compile_spec(spec, seed=0).state_dict()
    assert all(not torch.equal(final[name], fresh[name]) for name in head)  # the head trained
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    trainable = sum(final[name].numel() for name in head)
    assert result["trainable"] == trainable < result["params"]
    assert f"note: --freeze encoder: {trainable:,} of {result['params']:,} parameters train (the head's)" in printed
    assert f"trained {trainable:,} of {result['params']:,} parameters for 4 steps" in printed
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["identity"]["freeze"] == "encoder"


def test_freeze_without_init_and_through_the_python_api(folders, tmp_path):
    said: list[str] = []
    result = train(
        DIGITS,
        Settings(data=folders["three"], steps=2, batch_size=4),
        overrides=TINY,
        out=tmp_path / "run",
        progress=False,
        freeze="encoder",
        notes=said.append,
    )
    assert result.trainable < result.params and said == [
        f"--freeze encoder: {result.trainable:,} of {result.params:,} parameters train (the head's)"
    ]
    with pytest.raises(TrainError, match="--freeze 'decoder': expected one of: none, encoder"):
        train(DIGITS, Settings(steps=1), overrides=TINY, out=tmp_path / "other", progress=False, freeze="decoder")
    mae = cc.build(MAE, overrides=TINY)
    with pytest.raises(TrainError, match="has no head, so nothing would train"):
        finetune.freeze(mae, "encoder")
    assert not (tmp_path / "other").exists()


def test_an_encoder_that_does_not_fit_is_refused_before_anything_is_written(pretrained, folders, tmp_path, capsys):
    before = snapshot(pretrained)
    wider = [arg for o in ["sizes.d=32", "sizes.heads=2", "sizes.head_dim=16", "sizes.depth=1"] for arg in ("--set", o)]
    err = _train(capsys, tmp_path / "run", folders["three"], "--init", str(pretrained), sets=wider, status=2)
    weights = pretrained / "model.safetensors"
    assert f"error: --init {pretrained}: " in err
    assert (
        "12 tensors of the weights do not fit spec 'crate-digits." in err
        and ".d-32.heads-2.head_dim-16.depth-1'" in err
    )
    assert f"preprocess.patch_embed.project.weight is (16, 12) in {weights}, (32, 12) here" in err
    assert err.count("\n") == 1 and err.endswith("; and 7 more. Nothing was written\n")
    # another primitive at the same place: its tensors are missing, and the init's are left over
    err = _train(
        capsys,
        tmp_path / "run",
        folders["three"],
        "--init",
        str(pretrained),
        status=2,
        sets=[*SETS, "--set", "encoder.layer.compress.primitive=tssa"],
    )
    assert f"encoder.layer_0.compress.temp (2, 1) is not in {weights}" in err
    # a deeper spec: the layers the init lacks
    err = _train(
        capsys,
        tmp_path / "run",
        folders["three"],
        "--init",
        str(pretrained),
        status=2,
        sets=[*SETS, "--set", "sizes.depth=2"],
    )
    assert f"encoder.layer_1.compress.norm.weight (16,) is not in {weights}" in err
    for folder, said in ((tmp_path / "missing", "does not exist"), (tmp_path, "no spec.yaml there")):
        err = _train(capsys, tmp_path / "run", folders["three"], "--init", str(folder), status=2)
        assert said in err
    assert not (tmp_path / "run").exists()
    assert snapshot(pretrained) == before


def test_a_masked_autoencoders_encoder_under_a_classifier_head(tmp_path, capsys):
    """The papers' protocol: pre-train CRATE-MAE, then fine-tune its encoder with a classification head."""
    _train(capsys, tmp_path / "mae", "photos", "--task", "mae", spec=MAE, steps=2)
    mae = tmp_path / "mae" / "final"
    mae_spec = cc.load_spec(mae / "spec.yaml")
    sizes = dict(mae_spec.sizes)
    classifier = tmp_path / "classifier.yaml"  # the same encoder, no mask, no decoder, a head
    classifier.write_text(f"""
name: crate-mae-classifier
sizes: {{image_size: 32, channels: 3, patch_size: 8, d: {sizes["d"]}, heads: {sizes["heads"]},
        head_dim: {sizes["head_dim"]}, depth: {sizes["depth"]}, classes: 2}}
input: {{name: images, shape: ["${{channels}}", "${{image_size}}", "${{image_size}}"]}}
preprocess:
  - {{name: patch_embed, primitive: patch_embed, args: {{patch_size: "${{patch_size}}", dim: "${{d}}", projection: conv, norm: false}}}}
  - {{name: class_token, primitive: class_token}}
  - {{name: positions, primitive: positions, args: {{init: sincos2d, trainable: false}}}}
encoder:
  depth: ${{depth}}
  layer:
    - {{name: compress, primitive: mssa, args: {{heads: "${{heads}}", head_dim: "${{head_dim}}"}}}}
    - {{name: sparsify, primitive: ista, args: {{step_size: 0.1, lambd: 0.5}}}}
  post:
    - {{name: norm, primitive: layernorm, args: {{eps: 1.0e-6}}}}
head:
  - {{name: classify, primitive: classify, args: {{classes: "${{classes}}", pool: cls}}}}
""")
    data = _images(tmp_path / "images", 3, 32, seed=2, count=4)
    err = _train(
        capsys,
        tmp_path / "run",
        data,
        "--init",
        str(mae),
        "--freeze",
        "encoder",
        spec=str(classifier),
        sets=[],
        steps=2,
    )
    assert f"note: head.classify (4 tensors) is not in {mae}: left newly initialized" in err
    decoder = sum(1 for name in _weights(mae) if name.startswith("decoder."))
    assert (
        f"note: {decoder + 1} tensors of {mae} not used by spec 'crate-mae-classifier': "
        f"decoder.* ({decoder} tensors), preprocess.mask (1 tensor)" in err
    )
    final, init = _weights(tmp_path / "run" / "final"), _weights(mae)
    encoder = [name for name in final if not name.startswith("head.")]
    assert any(name.startswith("encoder.layer_0.") for name in encoder)
    assert all(torch.equal(final[name], init[name]) for name in encoder)  # the MAE's encoder, frozen


def _kill(whole: Path, broken: Path, *, at: int | None) -> None:
    """``broken``: ``whole`` as a SIGKILL after its checkpoint at step ``at`` (None: before its first) leaves it."""
    shutil.copytree(whole, broken)
    for path in (broken / "checkpoints").iterdir():
        if at is None or int(path.name[5:]) > at:
            shutil.rmtree(path)
    shutil.rmtree(broken / "final")
    (broken / "result.json").unlink()


@pytest.mark.parametrize("at", [2, None])
def test_a_resumed_finetuning_run_is_exact(pretrained, folders, tmp_path, capsys, at):
    whole = tmp_path / "whole"
    _train(capsys, whole, folders["three"], "--init", str(pretrained), "--checkpoint-every", "2")
    _kill(whole, tmp_path / "broken", at=at)
    err = _train(capsys, tmp_path / "broken", folders["three"], "--resume")  # --init: the run's own
    assert ("left newly initialized" in err) == (at is None)  # from step 0 the init is applied again
    a, b = _weights(whole / "final"), _weights(tmp_path / "broken" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert train_losses(whole) == train_losses(tmp_path / "broken")


def test_resume_with_another_init_or_freeze_is_refused(pretrained, folders, tmp_path, capsys):
    run = tmp_path / "run"
    _train(capsys, run, folders["three"], "--init", str(pretrained), "--checkpoint-every", "2")
    _kill(run, tmp_path / "killed", at=2)
    run = tmp_path / "killed"
    before = snapshot(run)
    elsewhere = tmp_path / "copy"
    shutil.copytree(pretrained, elsewhere)
    cases = [
        (["--init", str(elsewhere)], f"--init: {pretrained.resolve()} in the run, {elsewhere.resolve()} now"),
        (["--freeze", "encoder"], "--freeze: none in the run, encoder now"),
    ]
    for extra, said in cases:
        err = _train(capsys, run, folders["three"], "--resume", *extra, status=2)
        assert f"error: --resume: {run} is another run: {said}." in err
    # the init's weights changed since the run started: the same path, other weights
    changed = tmp_path / "changed"
    shutil.copytree(pretrained, changed)
    fresh = tmp_path / "fresh"
    _train(capsys, fresh, folders["three"], "--init", str(changed), steps=2)
    tensors = _weights(changed)
    tensors["encoder.layer_0.sparsify.dictionary"] += 1
    from safetensors.torch import save_file

    save_file(tensors, changed / "model.safetensors")
    err = _train(capsys, fresh, folders["three"], "--resume", "--steps", "3", status=2)
    assert "--init: the weights of the build the run started from have changed since" in err
    with pytest.raises(WorkbenchError, match=r"--init: \S+ in the run, none now"):  # the Python API takes no default
        train(
            DIGITS,
            Settings(data=folders["three"], steps=4, batch_size=4, log_every=1, checkpoint_every=2),
            overrides=TINY,
            out=run,
            resume=True,
            progress=False,
        )
    assert snapshot(run) == before
