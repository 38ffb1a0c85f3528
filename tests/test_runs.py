"""A run has an identity: resume continues the same run exactly, or refuses with both values.

Every test drives the command line (``cli.main``) as a user would, on a tiny CRATE for the 8x8
digits (about a second a run), and checks what a user relies on: the exit status, the message,
and that nothing good was changed or lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runfiles import snapshot, train_losses
from safetensors.torch import load_file, save_file

from crate_compose import cli
from crate_compose.training.run_folder import identity, locks

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _args(out: Path, *extra: str, steps: int = 4, sets: tuple[str, ...] = ()) -> list[str]:
    overrides = [arg for o in [*TINY, *sets] for arg in ("--set", o)]
    return [
        "train",
        DIGITS,
        *overrides,
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--log-every",
        "1",
        "--checkpoint-every",
        "2",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert cli.main(_args(run)) == 0
    return run


@pytest.fixture
def killed(finished, tmp_path) -> Path:
    """The same run as if killed after its checkpoint at step 2 (what a SIGKILL leaves)."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.rmtree(run / "checkpoints" / "step-000004")
    shutil.rmtree(run / "final")
    (run / "result.json").unlink()
    return run


def _refused(capsys, argv: list[str], status: int = 2) -> str:
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == status, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


def test_a_run_records_its_identity_and_hash(finished):
    record = identity.read(finished)
    assert record.hash == identity.digest(record.identity) and len(record.hash) == 64
    assert record.identity["spec"]["sha256"] == hashlib.sha256((finished / "spec.yaml").read_bytes()).hexdigest()
    assert record.identity["settings"]["warmup"] == 1  # resolved: 5% of 4 steps, at least 1
    assert record.identity["data"]["name"] == "digits" and len(record.identity["data"]["fingerprint"]) == 64
    assert record.steps == 4 and record.cadence == {"eval_every": 0, "log_every": 1, "checkpoint_every": 2}
    assert record.history[0]["from_step"] == 0


def test_hybrid_resume_is_refused(killed, finished, capsys):
    """A killed ISTA run resumed with ISTA's soft threshold used to continue silently as a hybrid."""
    before = snapshot(killed)
    err = _refused(capsys, _args(killed, "--resume", sets=("encoder.layer.sparsify.primitive=ista_soft",)))
    assert "is another run" in err and "the spec differs" in err
    assert "primitive: ista'" in err and "primitive: ista_soft'" in err  # both values, as written in the spec
    assert "another --out" in err
    assert f"or its own spec: train {killed / 'spec.yaml'} --out {killed} --resume" in err
    assert snapshot(killed) == before
    # the hint works: the run's own spec continues it to the same losses as the run that was not killed
    assert cli.main(["train", str(killed / "spec.yaml"), "--out", str(killed), "--resume", "--no-progress"]) == 0
    assert train_losses(killed) == train_losses(finished)


@pytest.mark.parametrize(
    "option, value, shown",
    [
        ("--lr", "0.002", "settings.lr: 0.001 in the run, 0.002 now"),
        ("--seed", "1", "settings.seed: 0 in the run, 1 now"),
        ("--batch-size", "32", "settings.batch_size: 16 in the run, 32 now"),
        ("--data", "photos", ""),
    ],
)
def test_resume_refuses_other_settings_with_both_values(killed, capsys, option, value, shown):
    before = snapshot(killed)
    code = cli.main([*_args(killed, "--resume"), option, value])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert shown in err
    assert snapshot(killed) == before


def test_resume_takes_the_runs_own_options_and_continues_exactly(finished, killed, capsys):
    argv = [
        "train",
        DIGITS,
        *[a for o in TINY for a in ("--set", o)],
        "--out",
        str(killed),
        "--resume",
        "--no-progress",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert train_losses(killed) == train_losses(finished)
    a, b = load_file(finished / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [h["from_step"] for h in identity.read(killed).history] == [0, 2]


def test_a_finished_run_resumed_with_its_steps_changes_nothing(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = snapshot(run)
    assert cli.main(_args(run, "--resume")) == 0
    out = capsys.readouterr().out
    assert "is finished" in out and "Nothing was changed" in out
    assert snapshot(run) == before
    assert json.loads((run / "result.json").read_text())["metrics"]["test_accuracy"] >= 0  # still valid JSON


def test_a_finished_run_resumed_with_more_steps_continues(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    assert cli.main(_args(run, "--resume", steps=6)) == 0, capsys.readouterr().err
    assert json.loads((run / "result.json").read_text())["steps"] == 6
    assert sorted(train_losses(run)) == list(range(1, 7))
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"step-000002", "step-000004", "step-000006"}
    record = identity.read(run)
    assert record.steps == 6 and record.identity == identity.read(finished).identity  # the same run, longer
    _refused(capsys, _args(run, "--resume", steps=5))  # never shorter


def test_a_second_run_into_a_run_folder_needs_resume(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = snapshot(run)
    err = _refused(capsys, _args(run))
    assert "already holds a run" in err and "pass --resume" in err
    assert snapshot(run) == before


def test_train_refuses_a_folder_of_someone_elses_files(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my thesis")
    (folder / "spec.yaml").write_text("name: mine\n")
    before = snapshot(folder)
    err = _refused(capsys, _args(folder), status=1)  # an output that cannot be written there (as build's --out .)
    assert "not a crate-compose run" in err and "notes.txt" in err
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["notes.txt", "spec.yaml"]


def _tamper_state(run: Path, at: int, **changes) -> None:
    path = run / "checkpoints" / f"step-{at:06d}" / "state.json"
    state = json.loads(path.read_text())
    state.update(changes)
    path.write_text(json.dumps(state))


def _tamper_tensors(path: Path, change) -> None:
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def _nan_weight(tensors):
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], float("nan"))


CHECKPOINT_DAMAGE = {
    "negative step": (lambda run: _tamper_state(run, 2, step=-2), "says step -2"),
    "step of another folder": (lambda run: _tamper_state(run, 2, step=4), "says step 4"),
    "step as text": (lambda run: _tamper_state(run, 2, step="2"), "'step' is str"),
    "missing settings": (lambda run: _tamper_state(run, 2, settings=None), "'settings' is missing"),
    "other settings": (lambda run: _tamper_state(run, 2, settings={"lr": 5}), "settings."),
    "nan weights": (lambda run: _tamper_tensors(run / "checkpoints/step-000002/model.safetensors", _nan_weight), "NaN"),
    "nan moment": (
        lambda run: _tamper_tensors(
            run / "checkpoints/step-000002/optimizer.safetensors",
            lambda t: t.__setitem__("0.exp_avg", t["0.exp_avg"] * float("nan")),
        ),
        "0.exp_avg",
    ),
    "moment of another shape": (
        lambda run: _tamper_tensors(
            run / "checkpoints/step-000002/optimizer.safetensors", lambda t: t.__setitem__("0.exp_avg", torch.zeros(3))
        ),
        "0.exp_avg",
    ),
    "moment missing": (
        lambda run: _tamper_tensors(
            run / "checkpoints/step-000002/optimizer.safetensors", lambda t: t.pop("0.exp_avg_sq")
        ),
        "0.exp_avg_sq is missing",
    ),
    "rng of another dtype": (
        lambda run: _tamper_tensors(
            run / "checkpoints/step-000002/optimizer.safetensors",
            lambda t: t.__setitem__("rng.torch", t["rng.torch"].float()),
        ),
        "rng.torch",
    ),
    "cuda rng of another dtype": (
        lambda run: _tamper_tensors(
            run / "checkpoints/step-000002/optimizer.safetensors", lambda t: t.__setitem__("rng.cuda", torch.zeros(3))
        ),
        "rng.cuda is torch.float32 (3,)",
    ),
    "spec edited": (
        lambda run: (run / "checkpoints/step-000002/spec.yaml").write_text(
            (run / "checkpoints/step-000002/spec.yaml").read_text().replace("lambd: 0.1", "lambd: 0.5")
        ),
        "not the run's spec",
    ),
    "metrics cut": (lambda run: (run / "metrics.jsonl").write_text(""), "metrics.jsonl has 0 rows"),
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_is_named_and_nothing_changes(killed, capsys, damage):
    tamper, expected = CHECKPOINT_DAMAGE[damage]
    tamper(killed)
    before = snapshot(killed)
    err = _refused(capsys, _args(killed, "--resume"))
    assert "step-000002 cannot be resumed from" in err and expected in err, err
    assert "Nothing was changed" in err
    assert snapshot(killed) == before


def test_resume_from_an_earlier_checkpoint_moves_later_ones_aside(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _tamper_tensors(run / "checkpoints/step-000004/model.safetensors", _nan_weight)
    damaged = snapshot(run / "checkpoints" / "step-000004")
    err = _refused(capsys, _args(run, "--resume", steps=6))
    assert "--resume-from STEP (2)" in err
    assert cli.main(_args(run, "--resume-from", "2")) == 0, capsys.readouterr().err
    aside = next((run / "superseded").iterdir())
    assert snapshot(aside / "checkpoints" / "step-000004") == damaged  # moved, never deleted
    assert (aside / "final").is_dir() and (aside / "result.json").is_file()
    assert train_losses(run) == train_losses(finished)


def test_checks_that_could_fail_late_run_before_the_first_step(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("a file where checkpoints go")
    err = _refused(capsys, _args(run), status=1)
    assert "checkpoints is a file" in err
    assert not (run / "metrics.jsonl").exists()
    import shutil as shutil_module

    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: shutil_module._ntuple_diskusage(10**9, 10**9, 1000))
    err = _refused(capsys, _args(tmp_path / "small"), status=1)
    assert "the disk has 1.0 kB free" in err and "checkpoints" in err
    assert not (tmp_path / "small").exists()  # nothing left behind


def test_a_second_writer_is_refused_naming_the_first(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = snapshot(run)
    with locks.hold(run):
        err = _refused(capsys, _args(run, "--resume", steps=6), status=3)
    assert f"process {os.getpid()}" in err and "is in use" in err
    assert snapshot(run) == before


def test_a_log_gets_plain_lines_not_a_redrawn_bar(tmp_path):
    args = _args(tmp_path / "run", steps=300)
    args.remove("--no-progress")
    result = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", *args], env=ENV, capture_output=True, text=True, check=True
    )
    assert "\r" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert 10 <= len(lines) <= 12 and "step 300/300 (100%)" in result.stderr
    assert len(result.stderr) < 2_000


def test_a_finished_run_whose_result_was_lost_is_finished_again(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    expected = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text("{not json")
    assert cli.main(_args(run, "--resume")) == 0, capsys.readouterr().err
    again = json.loads((run / "result.json").read_text())
    assert again["metrics"] == expected["metrics"] and again["train_loss"] == expected["train_loss"]


def test_a_disk_that_fills_during_training_names_the_checkpoint_and_keeps_the_earlier_ones(
    tmp_path, capsys, monkeypatch
):
    """The disk holds enough at the start (checked) and fills up later (another writer): exit 1, the file
    named at its place in the checkpoint, the earlier checkpoint intact, no temporary folder left."""
    import safetensors.torch
    from safetensors import SafetensorError

    real, calls = safetensors.torch.save_file, []

    def filling(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) > 2:  # the weights and optimizer of step 2 fit, step 4's do not
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", filling)
    run = tmp_path / "run"
    err = _refused(capsys, _args(run), status=1)
    assert "No space left on device" in err and "checkpoints/step-000004/model.safetensors" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002"]
    assert not (run / "final").exists() and not (run / "result.json").exists()
    monkeypatch.setattr(safetensors.torch, "save_file", real)  # space again: the run resumes and finishes
    assert cli.main(_args(run, "--resume")) == 0
