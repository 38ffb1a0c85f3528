"""The ``local`` launcher: a grid's runs as parallel processes on this machine.

On a GPU machine each process sees only its own devices (``CUDA_VISIBLE_DEVICES``): one run per GPU, or per
``gpus_per_run`` GPUs, a run of several GPUs started by torchrun (one process per GPU, as ``torchrun
--standalone`` does by hand). On the CPU ``jobs`` processes share the cores, each with ``cores / jobs``
torch threads (two runs of two threads on two cores are slower than two of one). The calling process is
the queue: it starts a run when one ends, shows the board, and on Ctrl-C or SIGTERM passes SIGTERM to its
runs, which keep the steps they did in a checkpoint (``ablate --resume`` continues them), then stops.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Stopped
from ..files import write_atomic
from .jobs import LAUNCH_FILE, LOG_FILE, THREADS_VARIABLE, Job, LaunchError
from .status import Display, survey

POLL = 0.5  # seconds between looks at the runs
NO_WAIT_LOCAL = (
    "--no-wait: the local launcher's queue is the command itself (it starts a run when one ends); run it "
    "under nohup, tmux or screen to leave it, and watch with ablate --status"
)


@dataclass(frozen=True)
class Local:
    """``jobs`` runs at a time (on CUDA: as many as the GPUs hold, ``gpus_per_run`` each, when not given)."""

    jobs: int | None = None
    gpus_per_run: int = 1
    device: str = "cpu"
    name: str = "local"

    def slots(self) -> list[dict[str, str]]:
        """One environment per run that may run at once: its GPUs, or its share of the cores."""
        if self.device.startswith("cuda"):
            gpus = _visible_gpus()
            if self.gpus_per_run > len(gpus):
                raise LaunchError(
                    f"--gpus-per-run {self.gpus_per_run}: this machine shows {len(gpus)} GPU"
                    f"{'s' if len(gpus) != 1 else ''} ({', '.join(gpus) or 'none'})"
                )
            most = len(gpus) // self.gpus_per_run
            jobs = self.jobs or most
            if jobs > most:
                raise LaunchError(
                    f"--jobs {jobs} with --gpus-per-run {self.gpus_per_run} needs {jobs * self.gpus_per_run} "
                    f"GPUs; this machine shows {len(gpus)} ({', '.join(gpus)}): give --jobs {most} or fewer"
                )
            return [
                {"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * self.gpus_per_run : (i + 1) * self.gpus_per_run])}
                for i in range(jobs)
            ]
        if self.gpus_per_run > 1:
            raise LaunchError(
                f"--gpus-per-run {self.gpus_per_run} with --device {self.device}: GPUs per run need --device cuda"
            )
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        jobs = self.jobs or 1
        if jobs > cores:
            raise LaunchError(
                f"--jobs {jobs}: this machine gives this process {cores} core{'s' if cores != 1 else ''}, "
                f"so at most {cores} runs of a core each; give --jobs {cores} or fewer"
            )
        threads = str(cores // jobs)
        return [{THREADS_VARIABLE: threads, "OMP_NUM_THREADS": threads} for _ in range(jobs)]

    def check(self) -> None:
        self.slots()

    def run(
        self, todo: list[Job], every: list[Job], board: Display | None, wait: bool = True, folder: Path | None = None
    ) -> None:
        """Run ``todo``, ``jobs`` at a time, showing ``every`` run of the grid on ``board`` (``folder``: the
        SLURM launcher's submission folder; unused here)."""
        if not wait:
            raise LaunchError(NO_WAIT_LOCAL)
        from ..training.run import Termination  # Ctrl-C and SIGTERM noted, as a run notes them

        free, waiting, running = self.slots(), list(todo), {}
        stop, passed = Termination((signal.SIGINT, signal.SIGTERM)), False  # passed: the runs were sent SIGTERM
        try:
            with stop:
                while waiting or running:
                    while waiting and free and stop.signal is None:
                        job, slot = waiting.pop(0), free.pop(0)
                        running[job] = (self._start(job, slot), slot)
                    for job, (process, slot) in list(running.items()):
                        if process.poll() is not None:
                            _ended(job, process.returncode)
                            del running[job]
                            free.append(slot)
                    if board is not None:
                        board.show(survey(every))
                    if stop.signal is not None and not running:
                        break
                    if stop.signal is not None and not passed:  # the runs stop at their next step, kept
                        passed = True
                        for process, _ in running.values():
                            process.send_signal(signal.SIGTERM)
                    time.sleep(POLL)
        finally:
            for process, _ in running.values():  # an error of our own (or a second Ctrl-C): the runs stop
                process.send_signal(signal.SIGTERM)
            for job, (process, _) in running.items():
                process.wait()
                _ended(job, process.returncode)
        if stop.signal is not None:
            raise Stopped(
                f"stopped by {signal.Signals(stop.signal).name}: the running runs kept their steps in a checkpoint",
                "the same command with --resume continues the grid",
                signal=stop.signal,
            )

    def _start(self, job: Job, slot: dict[str, str]) -> subprocess.Popen:
        command = job.command()
        gpus = slot.get("CUDA_VISIBLE_DEVICES", "")
        if gpus.count(",") >= 1:  # several GPUs: one process each, under torchrun
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={gpus.count(',') + 1}",
                *command[1:],
            ]
        job.folder.mkdir(parents=True, exist_ok=True)
        with (job.folder / LOG_FILE).open("w") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **slot}, start_new_session=True
            )  # Ctrl-C reaches the queue, which passes it on
        write_atomic(
            job.folder / LAUNCH_FILE,
            json.dumps(
                {
                    "launcher": "local",
                    "pid": process.pid,
                    "host": socket.gethostname(),
                    "at": time.time(),
                    "log": str(job.folder / LOG_FILE),
                    **slot,
                },
                indent=1,
            )
            + "\n",
        )
        return process


def _ended(job: Job, status: int) -> None:
    """The launch record says how the process ended (the board reads it when the run did not)."""
    path = job.folder / LAUNCH_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    record["ended"] = f"exit status {status}" if status >= 0 else f"killed by {signal.Signals(-status).name}"
    write_atomic(path, json.dumps(record, indent=1) + "\n")


def _visible_gpus() -> list[str]:
    """The GPUs this process may give out: its ``CUDA_VISIBLE_DEVICES``, else every device torch sees."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [one for one in given.split(",") if one.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]
