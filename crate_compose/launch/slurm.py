"""The ``slurm`` launcher: one SLURM job per run, submitted through submitit, requeued and continued.

Every run of a grid is one task of one job array (a single ``sbatch``, so a grid of a hundred runs is
submitted in about a second), with the resources of :class:`Slurm`: ``nodes``, ``gpus_per_run`` (one
task per GPU, so a run of 8 GPUs on 2 nodes is 2 x 4 tasks that build one process group from SLURM's
variables, :mod:`crate_compose.training.world`), ``cpus_per_task``, ``partition``, ``time`` and anything
else ``sbatch`` takes (``extra``: account, qos, constraint, ...). The names are submitit's executor
parameters, which DINO's, MAE's and DeiT's launchers use.

What happens to a job on the cluster:

* ``time`` minus ``signal_delay`` seconds into a job, SLURM sends SIGUSR2 (``--signal=USR2@90``);
  the run stops at its next step, keeps the steps in a checkpoint, and submitit requeues the job, which
  continues the run from that checkpoint (exactly: the final weights are those of an uninterrupted run);
* a preemption or ``scontrol requeue`` sends SIGTERM: the same checkpoint, and SLURM requeues the job;
* ``scancel`` sends SIGTERM too: the checkpoint is kept, the run is shown cancelled, and ``ablate
  --resume`` submits it again.

submitit pickles the function a job runs (:class:`RunJob`: a run folder's path) into the submission
folder; the run itself is defined by its folder's JSON (:mod:`.jobs`), never by a pickle.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from ..errors import Stopped
from ..files import write_atomic
from .jobs import LAUNCH_FILE, Job, LaunchError, run_job
from .status import LIVE, Display, survey

SIGNAL_DELAY = 90  # seconds of warning before a time limit (submitit's default)
POLL = 2.0  # seconds between looks at the queue
FORBIDDEN = {"array", "output", "error", "signal", "requeue", "wrap", "parsable", "job-name"}  # the launcher's own


def minutes(text: str | int) -> int:
    """A SLURM time limit in minutes: ``90``, ``1:30:00``, ``2-00:00:00``, ``30:00`` (minutes:seconds)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
        if not match:
            raise ValueError(f"{text!r} is not a time limit: give minutes (90), H:MM:SS (1:30:00) or D-HH:MM:SS")
        days, first, second, third = (int(g) if g else None for g in match.groups())
        if third is not None:  # H:MM:SS
            value = first * 60 + second + (1 if third else 0)
        elif second is not None:  # D-HH:MM or MM:SS
            value = first * 60 + second if days is not None else first + (1 if second else 0)
        else:
            value = first * (60 if days is not None else 1)
        value += (days or 0) * 24 * 60
    if value < 1:
        raise ValueError(f"{text!r}: a time limit is at least a minute")
    return value


@dataclass(frozen=True)
class Slurm:
    """What every run of the grid asks SLURM for."""

    partition: str | None = None
    nodes: int = 1
    gpus_per_run: int = 0
    cpus_per_task: int = 1  # per GPU on a GPU run (one task per GPU): DINO's cpus_per_task
    tasks_per_node: int = 1  # on the CPU: processes of one run per node (a multi-process run without GPUs)
    time: int = 60 * 24  # minutes
    mem: str | None = None  # per node, as sbatch takes it (64G); None: the partition's default
    signal_delay: int = SIGNAL_DELAY
    extra: dict[str, Any] = field(default_factory=dict)  # account, qos, constraint, ...: sbatch's own names
    name: str = "slurm"

    def check(self) -> None:
        """What can be refused before anything is submitted (SLURM's own refusals come from sbatch)."""
        missing = [tool for tool in ("sbatch", "squeue", "scontrol") if shutil.which(tool) is None]
        if missing:
            raise LaunchError(
                f"--launcher slurm: {', '.join(missing)} not on the PATH: run on a machine of the "
                "cluster (a login node), load its SLURM module (module load slurm), or install "
                "SLURM's client (Debian: apt-get install slurm-client)"
            )
        if self.gpus_per_run and self.gpus_per_run % self.nodes:
            raise LaunchError(
                f"--gpus-per-run {self.gpus_per_run} does not divide among --nodes {self.nodes}: "
                "give a multiple of the nodes"
            )
        bad = sorted(set(self.extra) & FORBIDDEN)
        if bad:
            raise LaunchError(f"--slurm {bad[0]}=...: the launcher sets {', '.join(bad)} itself")
        if self.time * 60 <= self.signal_delay + 60:
            raise LaunchError(
                f"--time {self.time} min leaves no time to train before SLURM's warning, "
                f"{self.signal_delay} s before the limit: give a longer time limit"
            )

    def parameters(self, label: str) -> dict[str, Any]:
        """submitit's SlurmExecutor parameters."""
        per_node = self.gpus_per_run // self.nodes if self.gpus_per_run else 0
        found: dict[str, Any] = {
            "nodes": self.nodes,
            "ntasks_per_node": per_node or self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "time": self.time,
            "signal_delay_s": self.signal_delay,
            "job_name": label,
            "stderr_to_stdout": True,
            "additional_parameters": {"requeue": True, **self.extra},
        }
        if per_node:
            found["gpus_per_node"] = per_node
        if self.partition:
            found["partition"] = self.partition
        if self.mem:
            found["mem"] = self.mem
        return found

    def run(
        self, todo: list[Job], every: list[Job], board: Display | None, wait: bool = True, folder: Path | None = None
    ) -> None:
        """Submit ``todo`` as one job array, then (``wait``) show ``every`` run on ``board`` until none is live."""
        if todo:
            self.submit(todo, folder or todo[0].folder / "slurm")
        if wait:
            watch(every, board)

    def submit(self, todo: list[Job], folder: Path) -> list[str]:
        """One job array of ``todo``; its ids, written into each run's launch record."""
        existed = folder.exists()
        executor = submitit.SlurmExecutor(folder=str(folder), python=sys.executable, max_num_timeout=100)
        executor.update_parameters(**self.parameters(f"crate-compose-{len(todo)}-runs"))
        try:
            with executor.batch():
                jobs = [executor.submit(RunJob(str(job.run.resolve()))) for job in todo]
        except Exception as error:  # sbatch's refusal: its own words, nothing submitted, nothing left of it
            if not existed:
                shutil.rmtree(folder, ignore_errors=True)
            raise LaunchError(f"SLURM refused the jobs: {_refusal(error)}") from None
        ids = [str(job.job_id) for job in jobs]
        now = time.time()
        for job, slurm in zip(todo, jobs):
            job.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(
                job.folder / LAUNCH_FILE,
                json.dumps(
                    {
                        "launcher": "slurm",
                        "job": str(slurm.job_id),
                        "at": now,
                        "log": str(slurm.paths.stdout),
                        "submission": str(folder),
                    },
                    indent=1,
                )
                + "\n",
            )
        return ids


def _refusal(error: BaseException) -> str:
    """What sbatch said (its error lines), from submitit's exception."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower() and "sbatch" in line.lower()]
    lines = lines or [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(dict.fromkeys(lines))[:1000] or type(error).__name__


def watch(every: list[Job], board: Display | None) -> None:
    """Show the runs until none is pending, starting or running. Ctrl-C stops the watching, not the jobs."""
    try:
        while True:
            runs = survey(every)
            if board is not None:
                board.show(runs)
            if not any(one.state in LIVE for one in runs):
                return
            time.sleep(POLL)
    except KeyboardInterrupt:
        live = sum(one.state in LIVE for one in survey(every))
        raise Stopped(
            f"stopped watching (Ctrl-C): the {live} live job{'s' if live != 1 else ''} go on in SLURM",
            "crate-compose ablate --status DIR shows them, and the same command with --resume writes the "
            "table once they are done",
            signal=signal.SIGINT,
        ) from None


class RunJob(submitit.helpers.Checkpointable):
    """What a SLURM job runs: the run in ``run`` (:func:`crate_compose.launch.jobs.run_job`), in this process
    (each task of the job is one process of the run). Stopped by submitit's warning (SIGUSR2), the run keeps
    its steps, and the signal is passed on to submitit, which requeues the job (:meth:`checkpoint`: the same
    run, continued from its folder)."""

    def __init__(self, run: str) -> None:
        self.run = run

    def __call__(self) -> int:
        status = run_job(Path(self.run))
        if status == 128 + signal.SIGUSR2:
            os.kill(os.getpid(), signal.SIGUSR2)  # submitit's handler: requeue (rank 0), then exit
            time.sleep(5)  # the handler runs at the next bytecode; never return first
        if status:
            raise SystemExit(status)
        return status

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(RunJob(self.run))
