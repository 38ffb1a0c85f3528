"""The launchers against a real SLURM (docs/cluster.md): a one-node cluster on this machine, started by
``scripts/slurm-cluster`` (``make test`` as root; ``.ci/run`` requires it: ``CRATE_COMPOSE_REQUIRE_SLURM=1``
fails these tests instead of skipping them where no cluster is up).

On that cluster: a 2 x 2 grid gives the in-process grid's metrics and weights, bit for bit; two tasks of
``srun crate-compose train`` in a user's own sbatch script end with torchrun's weights; a job requeued in the
middle of its run ends bit-identical to an uninterrupted run; a cancelled job is reported, two ``ablate
--resume`` at once are one too many, and --resume completes the grid; a failing run is reported while the
others finish; SLURM's own refusals are shown, nothing submitted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from commands import CLI
from safetensors.torch import load_file
from test_launch import DIGITS, ENV, SPARSIFY, TINY, assert_same_runs

REQUIRED = os.environ.get("CRATE_COMPOSE_REQUIRE_SLURM") == "1"
WAIT = 600  # seconds a test waits for its jobs (two cores shared with the rest of the suite)


def _cluster() -> str | None:
    """Why no cluster can be used here, or None."""
    if not os.environ.get("SLURM_CONF"):
        return "no SLURM cluster is up (SLURM_CONF unset; make test starts one as root: scripts/slurm-cluster)"
    if shutil.which("sinfo") is None:
        return "SLURM's client commands are not on the PATH"
    found = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if found.returncode != 0 or not found.stdout.strip():
        return f"sinfo: {found.stderr.strip() or 'no node'}"
    return None


@pytest.fixture(scope="module")
def slurm():
    reason = _cluster()
    if reason is not None:
        if REQUIRED:
            pytest.fail(f"CRATE_COMPOSE_REQUIRE_SLURM=1 and {reason}")
        pytest.skip(reason)


pytestmark = pytest.mark.usefixtures("slurm")


def _sets() -> list[str]:
    return [a for o in TINY for a in ("--set", o)]


def _ablate(
    out: Path, *extra: str, swap: str = f"{SPARSIFY}=ista,ista_soft", seeds: int = 2, steps: int = 12
) -> list[str]:
    return [
        *CLI,
        "ablate",
        DIGITS,
        *_sets(),
        "--swap",
        swap,
        "--seeds",
        str(seeds),
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _cli(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env={**ENV, **kwargs.pop("env", {})}, capture_output=True, text=True, timeout=WAIT, **kwargs
    )


def _in_process(argv: list[str]) -> subprocess.CompletedProcess:
    """The same command with the in-process launcher, one torch thread (as a SLURM task of one CPU has)."""
    return _cli(argv, env={"OMP_NUM_THREADS": "1"})


def _until(condition, what: str, limit: float = WAIT):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"waited {limit:.0f} s for {what}; queue: {_queue()}")


def _queue() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout.strip()


def _launch(run: Path) -> dict:
    return json.loads((run / "launch" / "launch.json").read_text())


def _trained_to(run: Path, step: int) -> bool:
    path = run / "metrics.jsonl"
    return path.is_file() and any(
        json.loads(line).get("step", 0) >= step for line in path.read_text().splitlines() if line.strip().endswith("}")
    )


def test_a_grid_on_slurm_equals_the_grid_in_process(tmp_path):
    here, there = tmp_path / "here", tmp_path / "slurm"
    done = _in_process(_ablate(here))
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    sent = _cli(_ablate(there, "--launcher", "slurm", "--time", "30"))
    assert sent.returncode == 0, sent.stderr + _queue()
    assert "slurm: starting 4 of 4 runs" in sent.stderr and "Traceback" not in sent.stderr
    assert "sparsify=ista_soft, seed 1: finished, test_accuracy" in sent.stderr
    assert_same_runs(here, there)
    assert (here / "results.csv").read_text().split("\n")[1].split(",")[:5] == (
        there / "results.csv"
    ).read_text().split("\n")[1].split(",")[:5]
    jobs = {_launch(run)["job"] for run in there.glob("*/seed-*")}
    assert len(jobs) == 4 and len({job.split("_")[0] for job in jobs}) == 1  # one job array
    state = json.loads((there / "sparsify-ista" / "seed-0" / "launch" / "state.json").read_text())
    assert state["state"] == "finished" and state["job"] in jobs and state["restart"] == 0
    print(f"2 x 2 grid on SLURM: {time.monotonic() - started:.1f} s")


SBATCH = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --output={log}
srun {command}
"""


def test_two_tasks_of_srun_in_a_users_own_sbatch_script_end_with_torchruns_weights(tmp_path):
    argv = [
        "train",
        DIGITS,
        *_sets(),
        "--data",
        "digits",
        "--steps",
        "6",
        "--batch-size",
        "16",
        "--no-progress",
        "--logger",
        "none",
    ]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    reference = _cli(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "crate_compose.cli",
            *argv,
            "--out",
            str(tmp_path / "torchrun"),
        ],
        env={"OMP_NUM_THREADS": "1"},
    )
    assert reference.returncode == 0, reference.stderr
    script, log = tmp_path / "train.sh", tmp_path / "train.log"
    command = " ".join([*CLI, *argv, "--out", str(tmp_path / "srun")])
    script.write_text(SBATCH.format(log=log, command=command))
    sent = _cli(["sbatch", "--parsable", "--wait", str(script)], env={"OMP_NUM_THREADS": "1"})
    assert sent.returncode == 0, sent.stderr + (log.read_text() if log.exists() else "")
    a = load_file(tmp_path / "torchrun" / "final" / "model.safetensors")
    b = load_file(tmp_path / "srun" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = json.loads((tmp_path / "srun" / "run.json").read_text())["history"]
    assert history[0]["world"] == 2  # one run of two processes, not two runs
    assert log.read_text().count("trained ") == 1  # rank 0 alone prints


@pytest.mark.parametrize(
    "requeue", [["scontrol", "requeue"], ["scancel", "--signal=USR2"]], ids=["scontrol-requeue", "time-limit-warning"]
)
def test_a_job_requeued_in_the_middle_of_its_run_ends_bit_identical(tmp_path, requeue):
    """``scontrol requeue`` (SIGTERM; SLURM requeues), and SIGUSR2, the warning SLURM sends ahead of a time limit
    (the run stops, keeps its steps, and submitit requeues the job): either way the run continues from the
    checkpoint its stop wrote and ends with an uninterrupted run's weights."""
    steps = 3000
    argv = [
        "train",
        DIGITS,
        *_sets(),
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--no-progress",
        "--logger",
        "none",
        "--eval-every",
        "0",
    ]
    whole = _in_process([*CLI, *argv, "--out", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr
    run = tmp_path / "requeued"
    sent = _cli([*CLI, *argv, "--out", str(run), "--launcher", "slurm", "--time", "30", "--no-wait"])
    assert sent.returncode == 0, sent.stderr
    job = _launch(run)["job"]
    _until(lambda: _trained_to(run, 20), "the run to reach step 20")
    subprocess.run([*requeue, job], check=True)
    _until(lambda: (run / "result.json").is_file(), "the requeued run to finish")
    state = json.loads((run / "launch" / "state.json").read_text())
    assert state["state"] == "finished" and state["restart"] >= 1 and state["job"] == job
    history = json.loads((run / "run.json").read_text())["history"]
    assert len(history) == 2 and 0 < history[1]["from_step"] < steps  # continued from the stop's checkpoint
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(run / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses if r["kind"] == "train"] == [
        json.loads(line)["step"]
        for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]


def test_a_cancelled_job_is_reported_one_resume_at_a_time_and_resume_completes_the_grid(tmp_path):
    out = tmp_path / "grid"
    argv = _ablate(
        out, "--launcher", "slurm", "--time", "30", "--eval-every", "0", "--log-every", "50", steps=8000, seeds=1
    )
    sent = _cli([*argv, "--no-wait"])
    assert sent.returncode == 0, sent.stderr
    assert f"crate-compose ablate --status {out}" in sent.stderr
    victim = out / "sparsify-ista" / "seed-0"
    _until(lambda: _trained_to(victim, 10), "a run to start training")
    status = _cli([*CLI, "ablate", "--status", str(out)])
    assert status.returncode == 0 and "sparsify=ista, seed 0: running, step " in status.stdout, status.stdout
    subprocess.run(["scancel", _launch(victim)["job"]], check=True)
    _until(
        lambda: (
            "sparsify=ista, seed 0: cancelled" in _cli([*CLI, "ablate", "--status", str(out)]).stdout
            or "sparsify=ista, seed 0: stopped" in _cli([*CLI, "ablate", "--status", str(out)]).stdout
        ),
        "the cancelled job to be shown",
    )
    first = subprocess.Popen([*argv, "--resume"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _until(
        lambda: (out / ".lock").is_file() and '"pid": %d' % first.pid in (out / ".lock").read_text(),
        "the first --resume to hold the grid",
    )
    second = _cli([*argv, "--resume"])
    assert second.returncode == 3, second.stderr
    assert f"is in use by process {first.pid}" in second.stderr and "Traceback" not in second.stderr
    _, err = first.communicate(timeout=WAIT)
    assert first.returncode == 0, err
    assert "slurm: starting 1 of 2 runs (1 finished or live)" in err
    table = (out / "results.md").read_text()
    assert "Missing runs" not in table and table.count(" | 1 | ") == 2


def test_a_failing_run_on_slurm_is_reported_while_the_others_finish(tmp_path):
    out = tmp_path / "grid"
    done = _cli(
        _ablate(
            out,
            "--launcher",
            "slurm",
            "--time",
            "30",
            swap="encoder.layer.sparsify.args.step_size=0.1,1e30",
            seeds=1,
            steps=8,
        )
    )
    assert done.returncode == 4, done.stderr
    reason = "failed: the loss is nan at step 1: the run diverged and was stopped"
    assert f"step_size=1e30, seed 0: {reason}" in done.stderr and "Traceback" not in done.stderr
    assert "step_size=0.1, seed 0: finished" in done.stderr
    table = (out / "results.md").read_text()
    assert "| step_size=1e30 | — | — (no run finished) | — | 0 of 1 |" in table and f"seed 0: {reason}" in table


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--partition", "nope"], "invalid partition specified: nope"),
        (["--slurm", "gres=gpu:1"], "Invalid generic resource (gres) specification"),
        (["--cpus-per-task", "512"], "More processors requested than permitted"),
        (["--partition", "short", "--time", "10"], "Requested time limit is invalid"),
    ],
)
def test_slurms_own_refusal_is_shown_and_nothing_is_submitted(tmp_path, extra, said):
    out = tmp_path / "grid"
    before = _queue()
    refused = _cli(_ablate(out, "--launcher", "slurm", "--time", "3", *extra, seeds=1))
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: SLURM refused the jobs: ") and said in last, refused.stderr
    assert "Traceback" not in refused.stderr
    assert not list(out.glob("*/seed-*/launch/launch.json")) and not list(out.glob("*/seed-*/run.json"))
    assert _queue() == before or "crate-compose" not in _queue().replace(before, "")
