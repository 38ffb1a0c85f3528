"""Tasks as a registry: every registered task trains, resumes exactly, evaluates and is probed through one
declaration (its example run), and a task added in one class works through ``train`` with no branch elsewhere."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from crate_compose import cli, tasks
from crate_compose.assessment.run_probes import probe_run
from crate_compose.assessment.scoring import evaluate_weights
from crate_compose.errors import TrainError
from crate_compose.settings import Settings, settings_of
from crate_compose.tasks import settings_problems
from crate_compose.tasks import task_registry as registry
from crate_compose.tasks.classification import Classification
from crate_compose.training.run import train

EVERY_TASK = [pytest.param(one, id=one.name) for one in tasks.all_tasks()]


def _settings(task: tasks.Task, steps: int = 4) -> Settings:
    return settings_of(
        dict(
            task=task.name,
            data=task.example.data,
            steps=steps,
            batch_size=8,
            eval_every=0,
            checkpoint_every=2,
            log_every=1,
            logger="none",
            warmup=1,
            **dict(task.example.settings),
        )
    )


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("task", EVERY_TASK)
def test_every_task_trains_resumes_exactly_evaluates_and_is_probed(task, tmp_path):
    example = task.example
    whole = train(example.spec, _settings(task), overrides=example.overrides, out=tmp_path / "whole", progress=False)
    assert set(task.columns) <= set(whole.metrics), (task.columns, whole.metrics)
    assert all(math.isfinite(whole.metrics[name]) for name in task.columns)
    assert task.metric in task.columns

    shutil.copytree(tmp_path / "whole", tmp_path / "again")  # the same run, resumed from its step-2 checkpoint
    resumed = train(
        example.spec,
        _settings(task),
        overrides=example.overrides,
        out=tmp_path / "again",
        resume_from=2,
        progress=False,
    )
    first, second = _weights(tmp_path / "whole" / "final"), _weights(tmp_path / "again" / "final")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert resumed.metrics == whole.metrics

    evaluated = evaluate_weights(tmp_path / "whole")  # the run's own task, data and seed: its own numbers
    assert evaluated["task"] == task.name
    read = "ema_" if task.weights == "final-ema" else ""  # a DINO run is read through its teacher, the average
    assert {name: evaluated[name] for name in task.columns} == {
        name: whole.metrics[read + name] for name in task.columns
    }

    table, figure, runs = probe_run(tmp_path / "whole", out=tmp_path / "probes", notes=lambda note: None, logger="none")
    assert table.is_file() and figure.is_file()
    assert runs["trained"] and all(math.isfinite(row["value"]) for row in runs["trained"])


@pytest.mark.parametrize("task", EVERY_TASK)
def test_every_task_is_listed_with_what_it_trains_on_and_how_it_ranks(task, capsys):
    assert cli.main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    assert f"{task.name}  " in out and task.summary in out and f"ranked by {task.metric}" in out
    assert task.name in tasks.names() and tasks.get(task.name) is task


def test_every_task_refuses_data_it_does_not_train_on(tmp_path):
    for task in tasks.all_tasks():
        other = next(one.example.data for one in tasks.all_tasks() if not set(one.data_kinds) & set(task.data_kinds))
        with pytest.raises(TrainError, match=f"task '{task.name}' does not fit data set '{other}'"):
            train(
                task.example.spec,
                replace(_settings(task), data=other),
                out=tmp_path / task.name,
                overrides=task.example.overrides,
                progress=False,
            )
        assert not (tmp_path / task.name).exists()  # refused before the folder was made


def test_an_unknown_task_names_the_registered_ones():
    with pytest.raises(TrainError, match="unknown task 'segment'; expected one of: classify, mae, lm, dino"):
        tasks.get("segment")
    assert [name for name, _ in settings_problems(Settings(task="segment"))] == ["task"]


def test_the_metric_that_ranks_an_ablation_is_the_tasks():
    values = {"a": 0.2, "b": 0.5}
    assert tasks.get("classify").best(values) == "b"  # accuracy: higher is better
    assert tasks.get("mae").best(values) == "a" and tasks.get("lm").best(values) == "a"  # errors: lower
    assert tasks.get("dino").best(values) == "b"  # k-NN accuracy


class _Hinge(Classification):
    """A task added in one class: multi-class hinge loss on the logits (no other file changes)."""

    name = "hinge"
    summary = "multi-class hinge loss of the class"

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        return F.multi_margin_loss(outputs["output"].float(), y)


def test_a_task_added_in_one_class_trains_through_train_and_the_command_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(registry, "_TASKS", registry._TASKS.copy())
    registry._TASKS.add("hinge", _Hinge())
    assert "hinge" in tasks.names() and settings_problems(Settings(task="hinge")) == []
    example = _Hinge.example
    hinge = train(
        example.spec,
        replace(_settings(tasks.get("hinge")), steps=2),
        overrides=example.overrides,
        out=tmp_path / "hinge",
        progress=False,
    )
    cross = train(
        example.spec,
        replace(_settings(tasks.get("classify")), steps=2),
        overrides=example.overrides,
        out=tmp_path / "cross",
        progress=False,
    )
    assert hinge.train_loss != cross.train_loss  # its own loss trained it
    assert json.loads((tmp_path / "hinge" / "run.json").read_text())["identity"]["task"] == "hinge"
    assert cli.main(["list", "tasks"]) == 0 and "hinge" in capsys.readouterr().out
    sets = [arg for o in example.overrides for arg in ("--set", o)]
    assert (
        cli.main(
            [
                "train",
                example.spec,
                "--task",
                "hinge",
                "--steps",
                "1",
                "--batch-size",
                "8",
                *sets,
                "--out",
                str(tmp_path / "cli"),
                "--no-progress",
                "--logger",
                "none",
            ]
        )
        == 0
    )


def _presets():
    import crate_compose as cc

    return cc.presets()


@pytest.mark.parametrize("preset", _presets())
def test_every_preset_and_task_pair_is_trained_by_its_heads_task_or_refused_naming_it(preset):
    """A spec's head says what its output is (class scores, next-token scores, prototypes, SimDINO features, ...);
    a task whose head it is not refuses it before torch loads, naming the head and the task that trains it."""
    import crate_compose as cc
    from crate_compose import tasks
    from crate_compose.errors import TrainError
    from crate_compose.training.run_folder.preflight import check_task_head

    spec = cc.load_spec(preset)
    last = spec.head[-1].primitive if spec.head else None
    owners = [one.name for one in tasks.all_tasks() if last in one.heads]
    assert last is None or len(owners) == 1, (preset, last, owners)  # every shipped head is one task's
    for task in tasks.all_tasks():
        if last is None or task.name in owners:
            check_task_head(spec, task)  # its own task (or no head: the task's other checks decide)
            continue
        with pytest.raises(TrainError) as refused:
            check_task_head(spec, task)
        assert str(refused.value).startswith(f"spec '{spec.name}' ends in {last} (")
        assert f"which task {task.name} does not train" in str(refused.value)
        assert str(refused.value).endswith(f"--task {owners[0]} trains this spec")


def test_a_simdino_spec_trained_as_a_classifier_is_refused_before_anything_is_written(tmp_path, capsys):
    from crate_compose import cli

    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "crate-simdino-mini",
                "--task",
                "classify",
                "--data",
                "shapes",
                "--steps",
                "2",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: spec 'crate-simdino-mini' ends in simdino_head (SimDINO's projection head")
    assert (
        err.rstrip().endswith(
            "which task classify does not train (it trains a classify head); --task simdino trains this spec"
        )
        and not out.exists()
    )
