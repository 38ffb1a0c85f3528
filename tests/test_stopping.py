"""A stopped run keeps its work: Ctrl-C (SIGINT), like SIGTERM, finishes the step, writes a checkpoint, says what
was kept and how to continue, and exits 130; a second Ctrl-C stops at once, leaving the last complete checkpoint;
a run checkpoints by wall time too (--checkpoint-minutes, 15 by default); --resume of a run that kept no
checkpoint says at its start that it begins again from step 0. Real signals on real processes, under train,
ablate and torchrun."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import CLI, DIGITS, ENV, TINY, _losses, _run_args

import crate_compose as cc
from crate_compose import cli
from crate_compose.settings import Settings
from crate_compose.training import run as run_module

SETS = [arg for o in TINY for arg in ("--set", o)]


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until_step(run: Path, step: int, process: subprocess.Popen, limit: float = 240) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "metrics.jsonl").is_file() and any(s >= step for s in _steps(run)):
            return
        time.sleep(0.02)
    raise AssertionError(f"the run never reached step {step}: {process.communicate()[1][-2000:]}")


def _steps(run: Path) -> list[int]:
    steps = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return steps


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_ctrl_c_keeps_the_steps_done_and_resume_ends_where_an_uninterrupted_run_ends(tmp_path):
    steps, run, whole = 1000, tmp_path / "run", tmp_path / "whole"
    process = _start([*CLI, *_run_args(run, steps, "--logger", "none")])
    _until_step(run, 5, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    after = int(line.split()[5].replace(",", ""))
    assert line == (
        f"stopped by SIGINT after step {after:,} of {steps:,}: the last checkpoint kept is step {after:,} "
        f"({run / 'checkpoints'}/step-{after:06d}); crate-compose train ... --out {run} --resume continues "
        "from it"
    )
    assert [p.name for p in (run / "checkpoints").iterdir()] == [f"step-{after:06d}"]  # nothing half written
    resumed = subprocess.run(
        [*CLI, *_run_args(run, steps, "--logger", "none", "--resume")], env=ENV, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at step {after:,} of {steps:,}" in resumed.stderr
    done = subprocess.run([*CLI, *_run_args(whole, steps, "--logger", "none")], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _same_weights(run, whole) and _losses(run) == _losses(whole)


def test_a_second_ctrl_c_stops_at_once_leaving_the_last_complete_checkpoint(tmp_path):
    steps, run = 100_000, tmp_path / "run"
    process = _start([*CLI, *_run_args(run, steps, "--logger", "none", "--checkpoint-every", "50")])
    _until_step(run, 120, process)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)  # before the step ends: the process ends at once
    _, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept and all(name.startswith("step-") for name in kept), kept  # no staging folder left beside them
    last = run / "checkpoints" / kept[-1]
    assert int(kept[-1][5:]) >= 100 and cc.load_build(last) is not None  # complete: a build that loads
    assert json.loads((last / "state.json").read_text())["step"] == int(kept[-1][5:])


def test_a_run_checkpoints_by_wall_time_too(tmp_path, monkeypatch, capsys):
    """--checkpoint-minutes N: a checkpoint whenever N minutes passed since the last (here the clock runs a minute a
    look); 0: by --checkpoint-every alone. Not part of the run: a resume may change it."""
    clock = iter(range(0, 10**9, 61))
    monkeypatch.setattr(run_module.time, "monotonic", lambda: float(next(clock)))
    out = tmp_path / "run"
    assert cli.main(_run_args(out, 4, "--logger", "none", "--checkpoint-minutes", "1")) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-00000{s}" for s in (1, 2, 3, 4)]
    again = tmp_path / "again"
    assert cli.main(_run_args(again, 4, "--logger", "none", "--checkpoint-minutes", "0")) == 0
    assert sorted(p.name for p in (again / "checkpoints").iterdir()) == ["step-000004"]
    assert Settings().checkpoint_minutes == 15
    assert cli.main(_run_args(again, 6, "--logger", "none", "--resume", "--checkpoint-minutes", "1")) == 0


def test_resume_of_a_run_that_kept_no_checkpoint_says_it_starts_again(tmp_path):
    steps, run = 1500, tmp_path / "run"
    process = _start([*CLI, *_run_args(run, steps, "--logger", "none", "--checkpoint-minutes", "0")])
    _until_step(run, 3, process)
    process.kill()  # SIGKILL: no checkpoint written
    process.communicate(timeout=60)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    resumed = subprocess.run(
        [*CLI, *_run_args(run, steps, "--logger", "none", "--resume")], env=ENV, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"note: --resume: {run} kept no checkpoint, so the run starts again from step 0" in resumed.stderr
    assert sorted(_losses(run)) == list(range(1, steps + 1))  # every step once, from the first


def test_ctrl_c_under_ablate_keeps_the_run_and_names_the_grid(tmp_path):
    out = tmp_path / "grid"
    process = _start(
        [
            *CLI,
            "ablate",
            DIGITS,
            *SETS,
            "--swap",
            "encoder.layer.sparsify.primitive=ista,ista_soft",
            "--steps",
            "100000",
            "--batch-size",
            "16",
            "--log-every",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    _until_step(out / "sparsify-ista" / "seed-0", 5, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert (
        line.startswith("sparsify=ista, seed 0: stopped by SIGINT after step ") and "the last checkpoint kept" in line
    )
    assert line.endswith(f"crate-compose ablate ... --out {out} --resume continues the ablation from there")
    assert any((out / "sparsify-ista" / "seed-0" / "checkpoints").iterdir())


@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="no torchrun")
def test_ctrl_c_under_torchrun_stops_every_process_at_one_step_with_one_checkpoint(tmp_path):
    run, steps = tmp_path / "run", 600
    torchrun = str(Path(sys.executable).parent / "torchrun")
    process = _start(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "crate_compose.cli",
            *_run_args(run, steps, "--logger", "none"),
        ]
    )
    _until_step(run, 5, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=240)
    kept = [p.name for p in (run / "checkpoints").iterdir()]
    assert len(kept) == 1, (kept, err[-3000:])
    after = int(kept[0][5:])
    assert f"stopped by SIGINT after step {after:,} of {steps:,}: the last checkpoint kept is step {after:,}" in err
    resumed = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "crate_compose.cli",
            *_run_args(run, steps, "--logger", "none", "--resume"),
        ],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at step {after:,} of {steps:,}" in resumed.stderr
    assert sorted(_losses(run)) == list(range(1, steps + 1))
