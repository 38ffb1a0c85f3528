"""Training: the run folder, checkpoints without pickle, exact resume after SIGKILL, torchrun = one process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import crate_compose as cc
from crate_compose import cli
from crate_compose.data.batches import batch_indices
from crate_compose.training.run import Settings, TrainError, lr_at, train

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
CLI = [sys.executable, "-m", "crate_compose.cli"]


def _run_args(out: Path, steps: int, *extra: str) -> list[str]:
    sets = [arg for o in TINY for arg in ("--set", o)]
    return [
        "train",
        DIGITS,
        *sets,
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--log-every",
        "1",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "train"}


def test_schedule_warms_up_then_decays_to_zero():
    settings = Settings(steps=100, lr=1e-3, warmup=10)
    assert lr_at(1, settings) == pytest.approx(1e-4) and lr_at(10, settings) == pytest.approx(1e-3)
    assert lr_at(55, settings) == pytest.approx(5e-4) and lr_at(100, settings) == pytest.approx(0, abs=1e-12)


def test_batches_cover_each_epoch_once_and_depend_on_the_seed_only():
    settings = Settings(batch_size=10, seed=3)
    epoch = torch.cat([batch_indices(step, 50, settings) for step in range(1, 6)])
    assert sorted(epoch.tolist()) == list(range(50))
    assert not torch.equal(batch_indices(6, 50, settings), batch_indices(1, 50, settings))  # a new permutation
    assert torch.equal(batch_indices(7, 50, settings), batch_indices(7, 50, Settings(batch_size=10, seed=3)))


def test_a_short_run_writes_metrics_checkpoints_and_a_loadable_build(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 30, "--checkpoint-every", "10", "--eval-every", "15")) == 0
    printed = capsys.readouterr().out
    assert "trained" in printed and "test_accuracy" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 31))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [15, 30]
    assert (out / "metrics.csv").read_text().count("\n") == len(rows) + 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000010", "step-000020", "step-000030"]
    files = {p.suffix for p in (out / "checkpoints" / "step-000010").iterdir()}
    assert files == {".yaml", ".safetensors", ".py", ".txt", ".json"}  # nothing pickled
    assert "rng.torch" in load_file(out / "checkpoints" / "step-000010" / "optimizer.safetensors")
    model = cc.load_build(out / "final")
    assert model(torch.randn(2, 1, 8, 8))["output"].shape == (2, 10)
    losses = _losses(out)
    assert losses[30] < losses[1]  # it learns


def test_a_second_run_into_the_same_folder_needs_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 5)) == 0
    assert cli.main(_run_args(out, 5)) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert cli.main([*_run_args(out, 5, "--resume"), "--lr", "0.01"]) == 2  # another run
    assert "settings.lr: 0.001 in the run, 0.01 now" in capsys.readouterr().err
    assert cli.main(_run_args(tmp_path / "empty", 5, "--resume")) == 2
    assert "holds no run to resume" in capsys.readouterr().err


def test_bad_task_or_data_is_one_line(tmp_path, capsys):
    assert cli.main([*_run_args(tmp_path / "a", 5), "--data", "digitz"]) == 2
    assert "did you mean 'digits'" in capsys.readouterr().err
    assert cli.main([*_run_args(tmp_path / "b", 5), "--task", "mae"]) == 2
    assert (
        "which task mae does not train (it trains a spec with a mask step and no other task's head); --task classify"
        in capsys.readouterr().err
    )
    with pytest.raises(TrainError, match="no labels to classify"):
        train(
            "mae",
            Settings(task="classify", data="photos", steps=1),
            overrides=["sizes.depth=1"],
            out=tmp_path / "c",
            progress=False,
        )


def test_a_run_killed_with_sigkill_resumes_to_the_same_loss(tmp_path):
    steps = 80
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    subprocess.run(
        [*CLI, *_run_args(whole, steps, "--checkpoint-every", "10")], env=ENV, check=True, capture_output=True
    )
    process = subprocess.Popen(
        [*CLI, *_run_args(broken, steps, "--checkpoint-every", "10")],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (broken / "checkpoints" / "step-000020").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (broken / "final").exists(), "the run ended before it was killed: the test proved nothing"
    killed_at = max(int(p.name[5:]) for p in (broken / "checkpoints").glob("step-*"))
    assert killed_at < steps
    subprocess.run(
        [*CLI, *_run_args(broken, steps, "--checkpoint-every", "10", "--resume")],
        env=ENV,
        check=True,
        capture_output=True,
    )
    assert _losses(broken) == _losses(whole)  # every logged loss, before and after the kill
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(broken / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_torchrun_with_two_processes_equals_one_process(tmp_path):
    steps, single, double = 6, tmp_path / "one", tmp_path / "two"
    subprocess.run([*CLI, *_run_args(single, steps)], env=ENV, check=True, capture_output=True)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", "-m", "crate_compose.cli", *_run_args(double, steps)],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    one, two = _losses(single), _losses(double)
    assert one.keys() == two.keys() == set(range(1, steps + 1))
    assert max(abs(one[s] - two[s]) for s in one) < 1e-5
    a, b = load_file(single / "final" / "model.safetensors"), load_file(double / "final" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_train_on_a_folder_of_images_of_your_own(tmp_path, capsys):
    """A new user's own images in class folders (as CIFAR-10 or ImageNet written out), resized as asked."""
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for name in ("cats", "dogs"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(6):
            pixels = torch.randint(0, 256, (12, 12, 3), generator=rng, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{i}.png")
    sets = [arg for o in TINY for arg in ("--set", o)]
    code = cli.main(
        [
            "train",
            DIGITS,
            *sets,
            "--data",
            f"folder:{tmp_path / 'images'}",
            "--image-size",
            "8",
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert 0.0 <= result["metrics"]["test_accuracy"] <= 1.0
    spec = cc.load_spec(tmp_path / "run" / "spec.yaml")
    assert spec.input.shape == [3, 8, 8] and spec.head[0].args["classes"] == 2


def test_a_run_whose_output_no_longer_depends_on_its_input_is_stopped(tmp_path, capsys):
    """ISTA's threshold far above every token (lambda 10^4) zeroes every code: every example gets the
    same output and no gradient reaches the layers before. Such a run is stopped after 50 steps in a row
    (exit status 2, its checkpoints kept) instead of training on without learning anything."""
    from crate_compose.training.run import COLLAPSED

    out = tmp_path / "dead"
    args = _run_args(
        out,
        COLLAPSED + 30,
        "--set",
        "encoder.layer.sparsify.args.lambd=10000",
        "--checkpoint-every",
        "20",
        "--log-every",
        "10",
    )
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "every example has had exactly the same output since step 1 (50 steps in a row" in err
    assert "its checkpoints up to step 40 are intact; none is from before it" in err and "Traceback" not in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000020", "step-000040"]
    alive = tmp_path / "alive"  # the same run with the spec's threshold learns, and is not stopped
    assert cli.main(_run_args(alive, COLLAPSED + 5, "--log-every", "10")) == 0


def test_a_run_with_the_formulas_as_written_records_them_and_a_resume_with_others_is_refused(
    tmp_path, capsys, monkeypatch
):
    """``--formulas written``: the ISTA steps train as written (spied on), the run and every checkpoint record
    it, and the fast paths are back after the run; a resume with ``--formulas fast`` is refused with both
    values, one without continues as written; ``$CRATE_COMPOSE_FORMULAS`` gives a new run's default."""
    from crate_compose.modules import paths, sparsify

    written = []
    real = sparsify.ista_written
    monkeypatch.setattr(sparsify, "ista_written", lambda *a, **k: written.append(1) or real(*a, **k))
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 2, "--formulas", "written", "--checkpoint-every", "1")) == 0
    assert written and paths.formulas() == "fast"
    assert json.loads((out / "run.json").read_text())["identity"]["settings"]["formulas"] == "written"
    assert json.loads((out / "checkpoints/step-000001/state.json").read_text())["settings"]["formulas"] == "written"
    capsys.readouterr()
    assert cli.main(_run_args(out, 3, "--resume", "--formulas", "fast")) == 2
    assert "settings.formulas: written in the run, fast now" in capsys.readouterr().err
    written.clear()
    assert cli.main(_run_args(out, 3, "--resume")) == 0 and written  # the run's own formulas
    written.clear()
    assert cli.main(_run_args(tmp_path / "fast", 1)) == 0 and not written
    assert "formulas" not in json.loads((tmp_path / "fast" / "run.json").read_text())["identity"]["settings"]
    monkeypatch.setenv("CRATE_COMPOSE_FORMULAS", "written")
    assert cli.main(_run_args(tmp_path / "from-environment", 1)) == 0 and written
    record = json.loads((tmp_path / "from-environment" / "run.json").read_text())
    assert record["identity"]["settings"]["formulas"] == "written"


def test_each_progress_line_shows_its_own_steps_loss(tmp_path, capsys):
    """Without a terminal, a plain line at every tenth of the run: each line's loss is the loss of the step it
    counts (metrics.jsonl's), not the step's before, so the last line's is the summary's."""
    out = tmp_path / "run"
    assert cli.main([arg for arg in _run_args(out, 20) if arg != "--no-progress"]) == 0
    printed, err = capsys.readouterr()
    losses = _losses(out)
    lines = [line for line in err.splitlines() if line.startswith("step ") and "/20 (" in line]
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == list(range(2, 21, 2)), err
    for step, line in zip(steps, lines):
        assert f", loss {losses[step]:.4f}," in line, (step, line, losses[step])
    summary = next(line for line in printed.splitlines() if line.startswith("trained "))
    assert f" train loss {losses[20]:.4f}, " in summary


def test_the_summary_says_its_train_loss_is_the_last_batchs(tmp_path, capsys):
    """The summary's train loss is the last batch's alone, and says so; result.json keeps its keys, its
    train_loss the same value."""
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 5)) == 0
    losses = _losses(out)
    summary = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("trained "))
    assert "steps in " in summary and f": last batch's train loss {losses[5]:.4f}, test_accuracy " in summary
    result = json.loads((out / "result.json").read_text())
    assert set(result) == {"run", "steps", "train_loss", "metrics", "params", "seconds", "trainable"}
    assert result["train_loss"] == pytest.approx(losses[5])


def test_a_run_stopped_by_sigterm_says_where_and_resumes(tmp_path):
    """SIGTERM mid-run: the run stops at the next step's start, keeps every step done in a checkpoint, says so in
    one line naming the step and --resume, exit status 143, no traceback, nothing half written; --resume
    continues from that checkpoint (and is stopped the same way)."""
    run, steps = tmp_path / "run", 100_000
    args = [*CLI, *_run_args(run, steps, "--checkpoint-every", "5", "--logger", "none")]

    stops: set[int] = set()  # where the stops kept the steps done

    def stopped_after(checkpoint: str, *extra: str) -> tuple[str, int]:
        process = subprocess.Popen([*args, *extra], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / checkpoint).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 143, err
        assert "Traceback" not in err, err
        kept = max(int(p.name[5:]) for p in (run / "checkpoints").iterdir())
        line = err.strip().splitlines()[-1]
        assert line.startswith("stopped by SIGTERM after step "), err
        after = int(line.split()[5].replace(",", ""))
        assert kept == after < steps and kept >= int(checkpoint[5:])  # the steps done, kept at the stop
        stops.add(kept)
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
            {f"step-{s:06d}" for s in [*range(5, kept + 1, 5), *stops]}
        )  # nothing half written beside them
        assert line == (
            f"stopped by SIGTERM after step {after:,} of {steps:,}: the last checkpoint kept is step "
            f"{kept:,} ({run / 'checkpoints'}/step-{kept:06d}); crate-compose train ... --out {run} "
            "--resume continues from it"
        )
        assert max(_losses(run)) == after  # every step up to the stop was logged, none after
        return err, kept

    _, first = stopped_after("step-000010")
    assert not (run / "final").exists() and not (run / "result.json").exists()
    err, second = stopped_after(f"step-{first + 10:06d}", "--resume")
    assert f"resumed at step {first:,} of {steps:,}" in err and second > first


def test_the_sizes_the_data_fixes_do_not_rename_the_network(tmp_path, capsys):
    """The data's input (images resized to 16) refits the spec: its name stays the one written with the user's
    own --sets, in the run's spec.yaml, its record and its final build, as in the default run folder."""
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 2, "--image-size", "16")) == 0
    name = cc.load_spec(DIGITS, TINY).name
    spec = cc.load_spec(out / "spec.yaml")
    assert spec.name == name and spec.input.shape == [1, 16, 16]
    assert cc.spec_of(cc.load_build(out / "final")).name == name
    assert json.loads((out / "run.json").read_text())["identity"]["spec"]["name"] == name


def test_a_run_recorded_when_the_data_renamed_the_spec_resumes_under_its_own_name(tmp_path, capsys, monkeypatch):
    """A run recorded before the data's overrides stopped renaming the spec (its spec.yaml and run.json named
    ``...shape-...image_size-16``) resumes: under that name, from its checkpoint, to the end."""
    from crate_compose.training import preparation

    fit, out = preparation.fit, tmp_path / "run"
    with monkeypatch.context() as before:  # the naming of runs recorded before
        before.setattr(preparation, "fit", lambda *args, **kwargs: fit(*args, **{**kwargs, "renamed": True}))
        assert cli.main(_run_args(out, 4, "--image-size", "16", "--checkpoint-every", "2")) == 0
    old = cc.load_spec(out / "spec.yaml").name
    assert old != cc.load_spec(DIGITS, TINY).name and "16" in old  # the data's overrides named it
    capsys.readouterr()
    assert cli.main(_run_args(out, 6, "--image-size", "16", "--checkpoint-every", "2", "--resume")) == 0
    err = capsys.readouterr().err
    assert "resumed at step 4 of 6" in err, err
    assert cc.load_spec(out / "spec.yaml").name == old == cc.spec_of(cc.load_build(out / "final")).name
    assert json.loads((out / "run.json").read_text())["identity"]["spec"]["name"] == old
    assert sorted(_losses(out)) == list(range(1, 7))
