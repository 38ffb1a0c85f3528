"""A run to start elsewhere: what defines it, written into its folder, and the process that trains it.

``RUN/launch/`` is a launcher's corner of a run folder (a run never writes there itself)::

    job.json      what defines the run: the spec as read (its data, every ``extends`` merged), the overrides,
                  the settings, the start (``init``, ``freeze``), the recipe's text, the plug-ins to import,
                  the device and memory limit; enough to make the same :class:`RunDescription` anywhere
    state.json    what the process that trains it says of it: running (host, process id, SLURM job and
                  restart count), finished, stopped by a signal, or failed with the reason
    launch.json   how it was started: the launcher, the job id (SLURM) or process id (local), when
    log.txt       the process's output (local; SLURM keeps its own logs beside the submission)

``python -m crate_compose.launch.jobs RUN`` trains the run ``RUN/launch/job.json`` describes into ``RUN``,
continuing it when ``RUN`` holds its record (a requeued job, a grid resumed on another launcher). Its exit
status is the command line's (0, 1, 2, 3, 128 + a signal's number). Nothing in these files is executed:
JSON and the spec's plain data, read through the guarded readers.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..files import read_input, write_atomic

FOLDER = "launch"
JOB_FILE, STATE_FILE, LAUNCH_FILE, LOG_FILE = "job.json", "state.json", "launch.json", "log.txt"
FORMAT = 1
MAX_JOB_BYTES = 20_000_000  # a spec's data and a recipe: kilobytes; bounded all the same
THREADS_VARIABLE = "CRATE_COMPOSE_THREADS"  # torch threads of a launched run (a launcher's share of the cores)


class LaunchError(WorkbenchError):
    """A launcher that cannot start the runs (nothing was submitted); the CLI exits with status 2."""


@dataclass(frozen=True)
class Job:
    """A run a launcher starts: its folder and its label (``sparsify=ista_soft, seed 1``); ``argv``: a
    ``crate-compose`` command line to run instead of the job its folder describes (the experiment scripts'
    runs, each a ``train ... --out RUN`` of its own)."""

    run: Path
    label: str
    argv: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        return self.run / FOLDER

    def command(self, python: str = sys.executable) -> list[str]:
        """The process that trains it."""
        if self.argv:
            return [python, "-m", "crate_compose.cli", *self.argv]
        return [python, "-m", "crate_compose.launch.jobs", str(self.run)]


def write_job(
    run: Path, described, *, label: str, device: str = "cpu", memory_limit=None, plugins: tuple[str, ...] = ()
) -> Job:
    """Write what defines ``described`` (a :class:`~crate_compose.training.description.RunDescription`) into
    ``RUN/launch/job.json``; the :class:`Job`."""
    record = {
        "format": FORMAT,
        "label": label,
        "source": described.source.data,
        "overrides": list(described.overrides),
        "settings": asdict(described.settings),
        "init": str(described.init) if described.init else None,
        "freeze": described.freeze,
        "recipe": described.recipe,
        "device": device,
        "memory_limit": memory_limit,
        "plugins": [str(p) for p in plugins],
    }
    job = Job(Path(run), label)
    job.folder.mkdir(parents=True, exist_ok=True)
    write_atomic(job.folder / JOB_FILE, json.dumps(record, indent=1) + "\n")
    return job


def forget_job(job: Job) -> None:
    """Remove what :func:`write_job` wrote for a run that was never started (a submission SLURM refused), and
    the folders it leaves empty; a run folder that holds anything else is left as it is."""
    for name in (JOB_FILE,):
        (job.folder / name).unlink(missing_ok=True)
    for folder in (job.folder, job.run, job.run.parent):
        try:
            folder.rmdir()
        except OSError:  # not empty: the run's own files, the grid's other runs
            break


def read_record(path: Path, what: str, limit: int = MAX_JOB_BYTES) -> dict[str, Any] | None:
    """A launcher's JSON record (``job.json``, ``state.json``, ``launch.json``), None when there is none;
    a damaged one is a :class:`LaunchError` naming it."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        found = json.loads(read_input(path, limit=limit, what=what, error=LaunchError).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise LaunchError(
            f"{what} {path} is damaged ({str(error).splitlines()[0]}); remove it, and the launcher writes it again"
        ) from None
    if not isinstance(found, dict):
        raise LaunchError(f"{what} {path} is damaged (not a JSON object); remove it, and the launcher writes it again")
    return found


def read_job(run: Path) -> dict[str, Any]:
    """``RUN/launch/job.json``, checked."""
    path = Path(run) / FOLDER / JOB_FILE
    record = read_record(path, "the job")
    if record is None:
        raise LaunchError(f"{path}: no such file (a launcher writes it before it starts the run)")
    keys = {
        "format",
        "label",
        "source",
        "overrides",
        "settings",
        "init",
        "freeze",
        "recipe",
        "device",
        "memory_limit",
        "plugins",
    }
    if record.get("format") != FORMAT or set(record) != keys or not isinstance(record["settings"], dict):
        raise LaunchError(f"the job {path} is not a job of format {FORMAT} (keys {', '.join(sorted(keys))})")
    return record


def describe_job(record: dict[str, Any]):
    """The :class:`~crate_compose.training.description.RunDescription` a job record defines."""
    from ..settings import settings_of
    from ..training.description import describe

    return describe(
        record["source"],
        settings_of(record["settings"]),
        overrides=record["overrides"],
        init=record["init"],
        freeze=record["freeze"],
        recipe=record["recipe"],
    )


def write_state(run: Path, state: str, **details: Any) -> None:
    """``RUN/launch/state.json``: ``state`` (running, finished, stopped, failed) and who says so."""
    from ..training.world import slurm_job

    record = {
        "state": state,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "at": time.time(),
        **slurm_job(),
        **details,
    }
    folder = Path(run) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / STATE_FILE, json.dumps(record, indent=1) + "\n")


def run_job(run: Path) -> int:
    """Train the run ``RUN/launch/job.json`` describes (continued when ``RUN`` holds its record); the exit
    status the command line would give, the state written for the launcher (rank 0 alone)."""
    from ..errors import SpecError, Stopped
    from ..training import world

    run = Path(run)
    writer = world.rank() == 0
    threads = os.environ.get(THREADS_VARIABLE) or os.environ.get("SLURM_CPUS_PER_TASK")
    try:
        record = read_job(run)
        import crate_compose as cc

        cc.load_plugins(record["plugins"])
        if threads:
            import torch

            torch.set_num_threads(max(1, int(threads)))
        described = describe_job(record)
        from ..training.run import train_described
        from ..training.run_folder.identity import RUN_FILE

        if writer:
            write_state(run, "running")
        result = train_described(
            described,
            out=run,
            resume=(run / RUN_FILE).is_file(),
            device=record["device"],
            progress=False,
            memory_limit=record["memory_limit"],
        )
    except Stopped as stopped:
        if writer:
            write_state(run, "stopped", reason=stopped.state, signal=stopped.signal)
        print(stopped, file=sys.stderr, flush=True)
        return stopped.exit_status
    except (SpecError, WorkbenchError) as error:
        if writer:
            write_state(run, "failed", reason=str(error).splitlines()[0])
        print(f"error: {error}", file=sys.stderr, flush=True)
        return getattr(error, "exit_status", 2)
    except OSError as error:
        if writer:
            write_state(run, "failed", reason=f"cannot write output: {error}")
        print(f"error: cannot write output: {error}", file=sys.stderr, flush=True)
        return 1
    except Exception as error:  # a bug, or the machine's: the reason kept, the traceback in the log
        if writer:
            write_state(run, "failed", reason=f"{type(error).__name__}: {error}".splitlines()[0])
        traceback.print_exc()
        return 1
    if writer:
        write_state(run, "finished", metrics=_finite(result.metrics), steps=result.steps)
    print(f"{record['label']}: finished {result.steps:,} steps", flush=True)
    return 0


def _finite(metrics: dict[str, float]) -> dict[str, float | None]:
    return {
        k: (v if isinstance(v, (int, float)) and v == v and abs(v) != float("inf") else None)
        for k, v in metrics.items()
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m crate_compose.launch.jobs RUN (a run folder holding launch/job.json)", file=sys.stderr)
        return 2
    return run_job(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
