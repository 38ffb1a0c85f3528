"""Every learned number beside the untrained network's (issue 37): ``evaluate`` and ``linear-probe`` score the
untrained network of a run's spec, data and seed in one command; a run whose spec was edited after it trained is
refused rather than scored under its name; a spec a task cannot train is refused before it trains; figures name
weights without the folders of the machine they were made on."""

from __future__ import annotations

import json
import shutil

import pytest
from test_workbench import one_thread  # noqa: F401  (autouse: one thread for small matrices)

import crate_compose as cc
from crate_compose import cli
from crate_compose.errors import TrainError, WorkbenchError
from crate_compose.pictures.drawings import shown
from crate_compose.settings import Settings
from crate_compose.tasks import settings_problems

TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines") / "run"
    cc.train(
        "crate-digits",
        Settings(steps=40, batch_size=64, lr=3e-3, logger="none"),
        overrides=TINY,
        out=out,
        progress=False,
    )
    return out


def test_the_untrained_network_of_a_run_is_scored_in_one_command(run, capsys):
    trained = cc.evaluate(run)
    untrained = cc.evaluate(run, untrained=True)
    by_hand = cc.evaluate(run / "spec.yaml", "digits", untrained=True, seed=0)  # the spec alone, the run's seed
    assert untrained["test_accuracy"] == by_hand["test_accuracy"] and untrained["test_loss"] == by_hand["test_loss"]
    assert trained["test_accuracy"] > untrained["test_accuracy"]  # 40 steps learn the digits a little
    assert untrained["weights"].startswith("untrained, seed 0") and str(run / "final") in untrained["weights"]
    probe = cc.linear_probe(run, untrained=True)
    assert probe["weights"].startswith("untrained") and 0 <= probe["knn_accuracy"] <= 1
    assert cli.main(["evaluate", str(run), "--untrained"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["test_accuracy"] == untrained["test_accuracy"]
    with pytest.raises(WorkbenchError, match="--untrained"):  # a spec without weights asks for them, or --untrained
        cc.evaluate("crate-digits", "digits")


def test_linear_probe_of_a_run_scores_the_untrained_network_and_states_chance_in_the_same_call(run, capsys):
    assert cli.main(["linear-probe", str(run)]) == 0
    printed = json.loads(capsys.readouterr().out)
    alone = cc.linear_probe(run, untrained=True)
    assert printed["untrained"] == {key: alone[key] for key in ("weights", "test_accuracy", "knn_accuracy", "c")}
    assert printed["untrained"]["weights"].startswith("untrained, seed 0")
    assert printed["chance"] == pytest.approx(alone["chance"]) and 0.09 < printed["chance"] < 0.11  # 10 digits
    assert printed["weights"] == str(run / "final") and printed["test_accuracy"] != alone["test_accuracy"]
    assert cli.main(["linear-probe", str(run), "--no-untrained"]) == 0
    assert "untrained" not in json.loads(capsys.readouterr().out)
    assert "untrained" not in alone  # the baseline itself has none beside it


def test_the_untrained_network_of_a_run_of_another_seed_is_that_seeds(tmp_path):
    """linear-probe --untrained of a run of seed 1 probes the network seed 1 initializes, as evaluate does (its
    --seed used to default to 0, which also chose the untrained network: every seed's baseline was seed 0's)."""
    out = tmp_path / "seed1"
    cc.train(
        "crate-digits", Settings(steps=2, batch_size=16, seed=1, logger="none"), overrides=TINY, out=out, progress=False
    )
    probe = cc.linear_probe(out, untrained=True)
    assert probe["weights"].startswith("untrained, seed 1")
    by_hand = cc.linear_probe(out / "spec.yaml", "digits", untrained=True, seed=1)
    seed0 = cc.linear_probe(out / "spec.yaml", "digits", untrained=True, seed=0)
    assert probe["knn_accuracy"] == by_hand["knn_accuracy"] and probe["test_accuracy"] == by_hand["test_accuracy"]
    assert (probe["knn_accuracy"], probe["test_accuracy"]) != (seed0["knn_accuracy"], seed0["test_accuracy"])
    assert cc.evaluate(out, untrained=True)["weights"].startswith("untrained, seed 1")


@pytest.mark.parametrize("edited", ["spec.yaml", "final/spec.yaml", "both"])
def test_a_run_whose_spec_was_edited_after_it_trained_is_refused(run, tmp_path, capsys, edited):
    """Another network with the same shapes (ista swapped for ista_soft) would load the run's weights and be
    scored silently under its name."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for name in ["spec.yaml", "final/spec.yaml"] if edited == "both" else [edited]:
        path = copy / name
        path.write_text(path.read_text().replace("primitive: ista\n", "primitive: ista_soft\n"))
    for command in (["evaluate", str(copy)], ["probe", str(copy), "--logger", "none", "--out", str(tmp_path / "p")]):
        capsys.readouterr()
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "restore it" in err
        assert str(copy / ("spec.yaml" if edited != "final/spec.yaml" else "final/spec.yaml")) in err, err
    assert not (tmp_path / "p").exists()


def test_task_classify_refuses_a_spec_that_is_no_classifier_before_it_trains(tmp_path):
    with pytest.raises(TrainError, match=r"outputs \['B', 1, 64\].*not one score per class.*--task mae"):
        cc.train(
            "crate-mae-photos",
            Settings(steps=1, batch_size=8, logger="none"),
            overrides=["sizes.depth=1"],
            out=tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run").exists()


def test_a_teacher_too_cold_for_float32_is_refused_where_it_is_given():
    """(logits - center) / T overflows float32 for T around 1e-38 and the loss is not finite: refused at 0.001."""
    problems = dict(
        settings_problems(Settings(task="dino", options={"teacher_temp": 1e-30, "warmup_teacher_temp": 0.0005}))
    )
    assert set(problems) == {"teacher_temp", "warmup_teacher_temp"} and ">= 0.001" in problems["teacher_temp"]
    assert settings_problems(Settings(task="dino", options={"teacher_temp": 0.001})) == []


def test_figures_name_weights_without_the_machines_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shown(tmp_path / "runs" / "crate" / "final") == "runs/crate/final"  # under the working folder
    assert shown("/work/science/dino-seg40k/ds/crate-supervised/final") == "crate-supervised/final"
    assert shown("runs/x/final") == "runs/x/final"
