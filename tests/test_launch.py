"""Launchers without a cluster (docs/cluster.md): the local launcher's grid equals the in-process grid, bit for
bit; a run that fails is reported while the others finish, and the table says so; Ctrl-C keeps the runs'
steps and --resume completes the grid; ranks from srun's variables; stale locks taken over, live ones not;
every refusal located, before anything starts. The same against a real SLURM: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from commands import CLI
from safetensors.torch import load_file
from test_ablate import _refused

from crate_compose import cli
from crate_compose.ablation.grids import Grid
from crate_compose.ablation.study import ablate
from crate_compose.launch.jobs import LaunchError
from crate_compose.launch.local import Local
from crate_compose.settings import Settings
from crate_compose.training import world
from crate_compose.training.run_folder.locks import FolderBusy, hold

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SPARSIFY = "encoder.layer.sparsify.primitive"
CORES = len(os.sched_getaffinity(0))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _grid(steps: int = 12, **settings) -> Grid:
    return Grid(
        {SPARSIFY: ["ista", "ista_soft"]}, Settings(steps=steps, batch_size=16, **settings), seeds=2, overrides=TINY
    )


def runs_of(out: Path) -> dict[str, Path]:
    return {f"{p.parent.name}/{p.name}": p for p in sorted(out.glob("*/seed-*"))}


def assert_same_runs(one: Path, two: Path) -> None:
    """Every run of two grids: the same metrics and the same final tensors, bit for bit."""
    first, second = runs_of(one), runs_of(two)
    assert first.keys() == second.keys() and len(first) == 4
    for name in first:
        a, b = (json.loads((p / "result.json").read_text()) for p in (first[name], second[name]))
        assert (a["metrics"], a["train_loss"], a["steps"]) == (b["metrics"], b["train_loss"], b["steps"]), name
        x, y = (load_file(p / "final" / "model.safetensors") for p in (first[name], second[name]))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


@pytest.fixture
def threads_of_two_jobs():
    """The torch threads each of two local jobs gets (the cores split): the in-process grid computes with as
    many, so float reductions are split alike."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, CORES // 2))
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(CORES < 2, reason="two local jobs need two cores")
def test_a_grid_on_the_local_launcher_equals_the_grid_in_process(tmp_path, threads_of_two_jobs, capsys):
    here, local = tmp_path / "here", tmp_path / "local"
    rows = ablate(DIGITS, _grid(), out=here)
    launched = ablate(DIGITS, _grid(), out=local, launcher=Local(jobs=2))
    assert_same_runs(here, local)
    assert [(r.variant, r.values, r.params) for r in rows] == [(r.variant, r.values, r.params) for r in launched]
    err = capsys.readouterr().err
    assert "local: starting 4 of 4 runs" in err and "sparsify=ista_soft, seed 1: finished, test_accuracy" in err
    job = json.loads((local / "sparsify-ista" / "seed-0" / "launch" / "job.json").read_text())
    assert job["label"] == "sparsify=ista, seed 0" and job["overrides"][-1] == f"{SPARSIFY}=ista"
    # the launcher is no part of the identity: the in-process grid resumes as finished on the local launcher
    again = ablate(DIGITS, _grid(), out=here, resume=True, launcher=Local(jobs=2))
    assert "starting 0 of 4 runs (4 finished or live)" in capsys.readouterr().err
    assert [r.values for r in again] == [r.values for r in rows]


def test_a_failing_run_is_reported_the_others_finish_and_the_table_says_so(tmp_path, capsys):
    """A variant whose every step diverges (ISTA's step size 1e30: a non-finite loss at step 1) fails on the node,
    after every check before the start passed: its runs are reported with the reason, the others finish, the
    table marks the missing cells, counts the seeds behind each mean, and ablate exits 4."""
    out = tmp_path / "grid"
    argv = [
        "ablate",
        DIGITS,
        *[a for o in TINY for a in ("--set", o)],
        "--swap",
        "encoder.layer.sparsify.args.step_size=0.1,1e30",
        "--seeds",
        "2",
        "--steps",
        "8",
        "--batch-size",
        "16",
        "--no-progress",
        "--out",
        str(out),
        "--launcher",
        "local",
        "--jobs",
        str(min(2, CORES)),
    ]
    assert cli.main(argv) == 4
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    reason = "failed: the loss is nan at step 1: the run diverged and was stopped"
    assert f"step_size=1e30, seed 0: {reason}" in captured.err and f"step_size=1e30, seed 1: {reason}" in captured.err
    assert "step_size=0.1, seed 1: finished, test_accuracy" in captured.err
    table = (out / "results.md").read_text()
    assert "| step_size=1e30 | — | — (no run finished) | — | 0 of 2 |" in table
    assert "| step_size=0.1 | 1,418 |" in table and " | 2 | " in table
    assert "Missing runs (2; each mean above is over the seeds it counts):" in table
    assert f"- step_size=1e30, seed 1: {reason}" in table
    assert "2 runs did not finish" in captured.err
    status = subprocess.run([*CLI, "ablate", "--status", str(out)], capture_output=True, text=True, env=ENV)
    assert status.returncode == 0, status.stderr
    assert "4 runs: 2 finished, 2 failed" in status.stdout and reason in status.stdout


@pytest.mark.skipif(CORES < 2, reason="two local jobs need two cores")
def test_ctrl_c_on_the_local_launcher_keeps_the_runs_and_resume_completes_the_grid(tmp_path):
    """SIGINT to ablate: its runs get SIGTERM, keep their steps in a checkpoint, and the grid stops with 130;
    --resume continues them to the weights of an uninterrupted grid."""
    steps, stopped, whole = 400, tmp_path / "stopped", tmp_path / "whole"
    base = [
        *CLI,
        "ablate",
        DIGITS,
        *[a for o in TINY for a in ("--set", o)],
        "--swap",
        f"{SPARSIFY}=ista,ista_soft",
        "--seeds",
        "2",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--no-progress",
        "--launcher",
        "local",
        "--jobs",
        "2",
        "--eval-every",
        "0",
    ]
    process = subprocess.Popen(
        [*base, "--out", str(stopped)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(
        '"kind": "train"' in (p / "metrics.jsonl").read_text()
        for p in stopped.glob("*/seed-*")
        if (p / "metrics.jsonl").is_file()
    ):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "stopped by SIGINT" in err and "--resume" in err
    kept = [p for p in stopped.glob("*/seed-*") if any((p / "checkpoints").glob("step-*"))]
    assert kept and not any((p / "result.json").exists() for p in kept)  # stopped mid-run, its steps kept
    resumed = subprocess.run([*base, "--out", str(stopped), "--resume"], env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    done = subprocess.run([*base, "--out", str(whole)], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert_same_runs(stopped, whole)


# ---------------------------------------------------------------- ranks and locks


def test_ranks_come_from_torchrun_else_from_srun_else_one_process(monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_NTASKS",
    ):
        monkeypatch.setenv(name, "")  # recorded, so that what rendezvous() writes is undone after the test
        monkeypatch.delenv(name)
    assert (world.rank(), world.world_size(), world.local_rank()) == (0, 1, 0)
    monkeypatch.setenv("SLURM_PROCID", "0")  # an sbatch script of --ntasks=4 itself: one process
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert (world.rank(), world.world_size()) == (0, 1)
    world.rendezvous()
    assert "MASTER_ADDR" not in os.environ
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")  # a task srun started
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[03-05,7]")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert (world.rank(), world.world_size(), world.local_rank()) == (5, 8, 1)
    world.rendezvous()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("5", "8", "1")
    assert os.environ["MASTER_ADDR"] == "gpu03" and 20000 <= int(os.environ["MASTER_PORT"]) < 30000
    assert [world.first_host(n) for n in ("node1", "a[1-3],b2", "cpu[007,9]")] == ["node1", "a1", "cpu007"]


HOLDER = """
import os, sys, time
from crate_compose.training.run_folder.locks import hold
with hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(folder: Path, **env: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], env={**ENV, **env}, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_requeued_jobs_stale_lock_is_named_and_taken_over_a_live_one_wins(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "run"
    before = _holder(folder, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="0")  # the job before its requeue, on a
    try:  # server that has not let go
        monkeypatch.setenv("SLURM_JOB_ID", "77")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
        with pytest.raises(FolderBusy, match=r"in use by process \d+ on .*SLURM job 77"):
            with hold(folder):
                pass
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job
        with hold(folder):
            record = json.loads((folder / ".lock").read_text())
        assert (record["job"], record["restart"], record["pid"]) == ("77", 1, os.getpid())
        err = capsys.readouterr().err
        assert f"lock was held by process {before.pid} on {socket.gethostname()}" in err
        assert "it is SLURM job 77 before its requeue (restart 0; this is restart 1): taking it over" in err
    finally:
        before.kill()
        before.wait()
    monkeypatch.delenv("SLURM_JOB_ID")
    live = _holder(folder)  # a live process of this host, no SLURM job: it wins
    try:
        with pytest.raises(FolderBusy, match=f"in use by process {live.pid}"):
            with hold(folder):
                pass
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------- refusals


def _ablate(out: Path, *extra: str) -> list[str]:
    return [
        "ablate",
        DIGITS,
        *[a for o in TINY for a in ("--set", o)],
        "--swap",
        f"{SPARSIFY}=ista,ista_soft",
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def test_launcher_settings_that_cannot_work_are_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    out = tmp_path / "grid"
    _refused(
        capsys,
        _ablate(out, "--launcher", "local", "--jobs", str(CORES + 1)),
        f"--jobs {CORES + 1}: this machine gives this process {CORES} core",
        f"give --jobs {CORES} or fewer",
    )
    _refused(
        capsys,
        _ablate(out, "--launcher", "local", "--partition", "gpu"),
        "--partition: not a setting of the local launcher; give --launcher slurm",
    )
    _refused(
        capsys, _ablate(out, "--jobs", "2"), "--jobs: not a setting of the in-process launcher; give --launcher local"
    )
    _refused(capsys, _ablate(out, "--launcher", "local", "--gpus-per-run", "2"), "--gpus-per-run 2 with --device cpu")
    _refused(
        capsys,
        _ablate(out, "--launcher", "slurm", "--gpus-per-run", "1"),
        "--gpus-per-run 1 with --device cpu: give --device cuda",
    )
    _refused(capsys, _ablate(out, "--launcher", "slurm", "--time", "soon"), "--time: 'soon' is not a time limit")
    _refused(capsys, _ablate(out, "--launcher", "slurm", "--time", "1"), "--time 1 min leaves no time to train")
    _refused(capsys, _ablate(out, "--launcher", "slurm", "--slurm", "array=0-3"), "the launcher sets array itself")
    _refused(
        capsys,
        _ablate(out, "--no-wait"),
        "--no-wait: the in-process launcher trains in this command; give --launcher slurm",
    )
    _refused(capsys, _ablate(out, "--launcher", "local", "--no-wait"), "--no-wait: the local launcher's queue is")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # a machine without SLURM's commands
    _refused(
        capsys,
        _ablate(out, "--launcher", "slurm"),
        "--launcher slurm: sbatch, squeue, scontrol not on the PATH",
        "apt-get install slurm-client",
    )
    assert not out.exists()  # nothing written, nothing submitted


def test_a_launcher_file_is_checked_key_by_key_at_its_lines(tmp_path, capsys):
    config = tmp_path / "cluster.yaml"
    config.write_text("launcher: slurm\npartiton: gpu\nnodes: 0\ntime: whenever\nslurm: [account]\n")
    err = _refused(capsys, _ablate(tmp_path / "grid", "--launcher-config", str(config)))
    assert f"{config}:2:1" in err and "unknown key 'partiton'" in err and "did you mean 'partition'" in err
    assert f"{config}:3:" in err and "nodes: a whole number of at least 1, not 0" in err
    assert f"{config}:4:" in err and "time: 'whenever' is not a time limit" in err
    assert f"{config}:5:" in err and "slurm: a mapping of sbatch options" in err
    config.write_text("launcher: local\njobs: 1\n")  # a good file: the command line wins over it
    _refused(
        capsys,
        _ablate(tmp_path / "grid", "--launcher-config", str(config), "--jobs", str(CORES + 1)),
        f"--jobs {CORES + 1}",
    )


def test_one_run_sent_to_the_local_launcher_is_the_run_train_makes(tmp_path, capsys):
    argv = [
        "train",
        DIGITS,
        *[a for o in TINY for a in ("--set", o)],
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
    here, there = tmp_path / "here", tmp_path / "there"
    threads = torch.get_num_threads()
    torch.set_num_threads(CORES)  # as the one local job's share of the cores
    try:
        assert cli.main([*argv, "--out", str(here)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert cli.main([*argv, "--out", str(there), "--launcher", "local"]) == 0
    out = capsys.readouterr().out
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(f"{json.loads((there / 'launch' / 'job.json').read_text())['label']}: finished, test_accuracy ")
    )
    a, b = (json.loads((p / "result.json").read_text()) for p in (here, there))
    assert (a["metrics"], a["train_loss"]) == (b["metrics"], b["train_loss"])
    assert json.loads((there / "launch" / "state.json").read_text())["state"] == "finished"
    _refused(capsys, [*argv, "--out", str(there), "--launcher", "local"], "already holds a run: pass --resume")
    _refused(capsys, ["ablate", "--status", str(there)], f"--status: {there} holds no ablation")


def test_on_a_gpu_machine_each_local_run_sees_only_its_own_gpus(monkeypatch):
    """The GPUs this process may give out (its CUDA_VISIBLE_DEVICES) dealt out, one run per GPU or per
    gpus_per_run; more than they hold refused. (The processes themselves need a GPU: make device-check.)"""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert Local(device="cuda").slots() == [{"CUDA_VISIBLE_DEVICES": d} for d in "0123"]
    assert Local(gpus_per_run=2, device="cuda").slots() == [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "2,3"},
    ]
    assert Local(jobs=1, gpus_per_run=2, device="cuda:0").slots() == [{"CUDA_VISIBLE_DEVICES": "0,1"}]
    with pytest.raises(LaunchError, match=r"--jobs 3 with --gpus-per-run 2 needs 6 GPUs; this machine shows 4"):
        Local(jobs=3, gpus_per_run=2, device="cuda").slots()
    with pytest.raises(LaunchError, match=r"--gpus-per-run 8: this machine shows 4 GPUs \(0, 1, 2, 3\)"):
        Local(gpus_per_run=8, device="cuda").slots()
    assert Local(jobs=1).slots() == [{"CRATE_COMPOSE_THREADS": str(CORES), "OMP_NUM_THREADS": str(CORES)}]


def test_slurm_runs_that_would_lose_a_whole_job_to_a_node_failure_are_warned(capsys):
    from crate_compose.cli.arguments import checkpoint_note
    from crate_compose.launch.slurm import Slurm

    checkpoint_note(Slurm(time=10), Settings(checkpoint_minutes=15))
    assert (
        "note: --time 10 min is no longer than --checkpoint-minutes 15: no periodic checkpoint"
        in capsys.readouterr().err
    )
    checkpoint_note(Slurm(time=60), Settings(checkpoint_minutes=0))
    assert "--checkpoint-every 0 --checkpoint-minutes 0: a run keeps its steps at its end" in capsys.readouterr().err
    for quiet in (Settings(), Settings(checkpoint_minutes=0, checkpoint_every=500)):
        checkpoint_note(Slurm(time=60), quiet)  # a checkpoint within every job
        checkpoint_note(Local(jobs=1), Settings(checkpoint_minutes=0))
        assert capsys.readouterr().err == ""
