"""One run, resolved once: a task declares its own options, and the command line, the recorded identity, the
resume checks and the refusal under another task all come from that declaration; a run's names (its spec,
task and data set) are turned into objects once, so an ablation looks each up once, not once per use."""

from __future__ import annotations

import collections
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from test_workbench import one_thread  # noqa: F401  (autouse: one thread for small matrices)

from crate_compose import cli, tasks
from crate_compose.data import set_registry as data_registry
from crate_compose.options import Option
from crate_compose.settings import OPTIONS, Settings
from crate_compose.spec_language import loader
from crate_compose.tasks import task_registry as registry
from crate_compose.tasks.classification import Classification
from crate_compose.training.run import train

EXAMPLE = Classification.example


class _MarginSession(tasks.Session):
    """The multi-class hinge loss with the run's own margin."""

    def loss(self, net, model, x, y, step, ema=None):
        outputs = net(x)
        margin = self.task.option(self.settings, "margin")
        return F.multi_margin_loss(outputs["output"].float(), y, margin=margin), outputs["output"]


class _Margin(Classification):
    """A task declared in this file alone, with one option of its own."""

    name = "margin"
    summary = "multi-class hinge loss with a margin of the run's choosing"
    options = (Option(float, 1.0, "the hinge's margin", low=0, low_open=True, name="margin"),)

    def session(self, model, settings, data):
        return _MarginSession(self, model, settings, data)


@pytest.fixture
def margin(monkeypatch):
    """Task margin registered through the public decorator, in a copy of the registry (gone after the test)."""
    monkeypatch.setattr(registry, "_TASKS", registry._TASKS.copy())
    registry.task(_Margin)
    return tasks.get("margin")


def _train(tmp_path, out, *extra) -> list[str]:
    sets = [arg for o in EXAMPLE.overrides for arg in ("--set", o)]
    return [
        "train",
        EXAMPLE.spec,
        *sets,
        "--data",
        EXAMPLE.data,
        "--batch-size",
        "8",
        "--log-every",
        "1",
        "--warmup",
        "1",
        "--logger",
        "none",
        "--no-progress",
        "--out",
        str(tmp_path / out),
        *extra,
    ]


def _refused(capsys, argv, *words) -> str:
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def test_a_task_option_declared_in_a_test_file_trains_resumes_and_is_refused_elsewhere(margin, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert "--margin" in capsys.readouterr().out  # the flag comes from the declaration

    # train: the option given on the command line is the run's, recorded in its identity
    assert (
        cli.main(
            _train(tmp_path, "run", "--task", "margin", "--margin", "2.5", "--steps", "4", "--checkpoint-every", "2")
        )
        == 0
    )
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["identity"]
    assert recorded["task"] == "margin" and recorded["settings"]["margin"] == 2.5
    straight = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))

    # exact resume from step 2: the option is not given again, the run's own is taken; the weights equal the
    # uninterrupted run's
    assert cli.main(_train(tmp_path, "run", "--resume-from", "2")) == 0
    resumed = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert cli.main(_train(tmp_path, "other", "--task", "margin", "--margin", "1.5", "--steps", "4")) == 0
    other = load_file(str(tmp_path / "other" / "final" / "model.safetensors"))
    assert not all(torch.equal(other[k], straight[k]) for k in straight)  # the option changes what is learned

    # a changed option on resume is another run: refused, naming both values
    before = (tmp_path / "run" / "run.json").read_text()
    _refused(
        capsys, _train(tmp_path, "run", "--resume", "--margin", "1", "--steps", "5"), "margin: 2.5 in the run, 1 now"
    )
    assert (tmp_path / "run" / "run.json").read_text() == before  # nothing written

    # the option under another task is refused before anything is written
    _refused(
        capsys,
        _train(tmp_path, "classify", "--task", "classify", "--margin", "2.5", "--steps", "1"),
        "margin: is an option of task margin, not of 'classify'",
    )
    assert not (tmp_path / "classify").exists()
    with pytest.raises(SystemExit) as stopped:  # its bounds, from the declaration, as the command line's error
        cli.main(_train(tmp_path, "bad", "--task", "margin", "--margin", "0", "--steps", "1"))
    assert stopped.value.code == 2 and "--margin: 0: must be greater than 0" in capsys.readouterr().err


def test_a_task_option_at_its_default_is_the_run_without_it(margin, tmp_path):
    settings = Settings(task="margin", data=EXAMPLE.data, steps=1, batch_size=8, logger="none", warmup=1)
    train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=tmp_path / "plain", progress=False)
    named = Settings(**{**settings.__dict__, "options": {"margin": 1.0}})
    train(EXAMPLE.spec, named, overrides=EXAMPLE.overrides, out=tmp_path / "named", progress=False)
    plain, said = (json.loads((tmp_path / r / "run.json").read_text()) for r in ("plain", "named"))
    assert plain["hash"] == said["hash"] and "margin" not in plain["identity"]["settings"]


def test_options_are_declared_once():
    """Every general setting is declared with a role, and no task option takes a general setting's name."""
    assert set(OPTIONS) == {f for f in Settings.__dataclass_fields__ if f != "options"}
    for name, option in tasks.task_options().items():
        assert name not in OPTIONS and option.task in tasks.names()
    with pytest.raises(ValueError, match="not a new setting name"):
        registry.task(
            type("Clash", (Classification,), {"name": "clash", "options": (Option(int, 1, "x", name="steps"),)})
        )
    assert "clash" not in tasks.names()


def test_a_two_by_two_ablation_resolves_each_name_once_per_variant(tmp_path, monkeypatch):
    counts: collections.Counter = collections.Counter()

    def counted(owner, name, key):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if sys._getframe(1).f_code.co_name != "load_build":  # a build written by a run, read back: not a name
                counts[key] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counted(tasks, "get", "task")
    counted(registry, "get", "task")
    counted(data_registry, "_claim", "data")  # a data set name parsed
    counted(loader, "load", "spec")
    sets = [arg for o in EXAMPLE.overrides for arg in ("--set", o)]
    argv = [
        "ablate",
        EXAMPLE.spec,
        *sets,
        "--swap",
        "encoder.layer.sparsify.primitive=ista,ista_soft",
        "--seeds",
        "2",
        "--steps",
        "1",
        "--batch-size",
        "8",
        "--data",
        EXAMPLE.data,
        "--logger",
        "none",
        "--no-progress",
        "--out",
        str(tmp_path / "grid"),
    ]
    assert cli.main(argv) == 0
    variants = 2  # (before the run was described once: 16 task lookups, 9 parses of the data set's name, 13
    # resolutions of the spec)
    assert counts["task"] <= variants and counts["data"] <= variants, counts
    # each variant's spec resolved once as written (and once more fitted to the data, when the data fixes a size:
    # digits fits crate-digits as written), the base once
    assert counts["spec"] <= variants + 1, counts


def test_a_run_recorded_when_dinos_options_were_every_runs_settings_resumes(tmp_path):
    """Before tasks declared their options, every checkpoint saved DINO's four settings (at their defaults for
    another task) beside the others: such a checkpoint still resumes, as does a DINO run.json whose identity
    holds them flat among the settings."""
    import shutil

    run = tmp_path / "run"
    settings = Settings(data=EXAMPLE.data, steps=4, batch_size=8, checkpoint_every=2, logger="none", warmup=1)
    train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=run, progress=False)
    shutil.rmtree(run / "checkpoints/step-000004"), shutil.rmtree(run / "final"), (run / "result.json").unlink()
    state_file = run / "checkpoints/step-000002/state.json"
    state = json.loads(state_file.read_text())
    state["settings"].update(local_crops=8, teacher_temp=0.04, warmup_teacher_temp=0.04, warmup_teacher_temp_epochs=0)
    state_file.write_text(json.dumps(state))
    assert train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=run, resume=True, progress=False).steps == 4

    from crate_compose.settings import settings_of
    from crate_compose.training.run_folder import identity

    recorded = identity.Record(
        {
            "spec": {"name": "x", "sha256": "0"},
            "task": "dino",
            "data": {"name": "digits", "fingerprint": "0"},
            "settings": {"lr": 0.001, "local_crops": 2, "teacher_temp": 0.07},
            "version": "0.1.0",
        },
        10,
        {"eval_every": 0, "log_every": 10, "checkpoint_every": 0},
    )
    again = settings_of(recorded.settings())
    assert again.options == {"local_crops": 2, "teacher_temp": 0.07} and again.task == "dino"
    assert tasks.settings_problems(again) == []


def test_numbers_that_are_not_plausible_are_refused_or_said(tmp_path, capsys):
    """A step count past any run (an extra zero), a warm-up longer than the run: refused with the reason before
    anything is written; a learning rate outside any network's range: trained, with a warning line first."""
    from crate_compose.settings import MAX_STEPS

    base = [
        "train",
        "specs/crate-digits.yaml",
        "--set",
        "sizes.depth=1",
        "--set",
        "sizes.d=16",
        "--set",
        "sizes.heads=2",
        "--set",
        "sizes.head_dim=8",
        "--batch-size",
        "16",
        "--no-progress",
        "--logger",
        "none",
    ]
    with pytest.raises(SystemExit):
        cli.main([*base, "--steps", "100000000000", "--out", str(tmp_path / "a")])
    assert f"argument --steps: 100000000000: must be in [1, {MAX_STEPS}]" in capsys.readouterr().err
    assert cli.main([*base, "--steps", "100", "--warmup", "500", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err == (
        "error: warmup: 500 steps of warm-up are more than the run's 100 steps: the "
        "learning rate would never reach its peak\n"
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert cli.main([*base, "--steps", "2", "--lr", "50", "--out", str(tmp_path / "c")]) in (0, 2)
    assert (
        "note: --lr 50 is above any learning rate these networks train at (1e-07 to 1; AdamW's usual peak is "
        "1e-4 to 1e-2): training with it as given" in capsys.readouterr().err
    )
    assert cli.main([*base, "--steps", "2", "--lr", "1e-3", "--out", str(tmp_path / "d")]) == 0
    assert "learning rate these networks" not in capsys.readouterr().err
