"""What each launched run is doing, read from its folder and its scheduler; a board that shows it live.

A run's state comes from what it wrote (``result.json``: finished; ``launch/state.json``: running, stopped,
failed with the reason; ``metrics.jsonl``'s last row: the step and the loss) and from its launcher
(``launch/launch.json``: the SLURM job id, asked of ``squeue``; a local process id, asked of this
machine). A job that left the queue without a word from the run (a node that died, ``scancel`` before it
started, a process killed) is said with the scheduler's state and the last line of its log. Nothing here
writes; any number of shells may watch one grid (``ablate --status``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..training.world import alive
from .jobs import LAUNCH_FILE, LOG_FILE, STATE_FILE, Job, LaunchError, read_record

TAIL_BYTES = 16_384  # of metrics.jsonl and a log: the last rows are all the board needs
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING", "SUSPENDED")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING")
DONE = ("finished",)  # states after which a launcher has nothing left to do for a run
LIVE = ("pending", "starting", "running")


@dataclass
class Seen:
    """One run as the board shows it."""

    label: str
    run: Path
    state: str  # not started, unfinished, pending, starting, running, finished, stopped, cancelled, failed
    job: str = ""  # the SLURM job id or the local process id
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    log: str = ""  # the last line of its log

    def line(self, metric: str | None = None) -> str:
        """``sparsify=ista, seed 0: running, step 120 of 400, loss 1.2345 (job 5_0)``."""
        said = self.state
        if self.step is not None and self.state in ("running", "stopped", "cancelled", "failed", "unfinished"):
            said += f", step {self.step:,}" + (f" of {self.steps:,}" if self.steps else "")
            said += f", loss {self.loss:.4f}" if self.loss is not None else ""
        if self.state == "finished" and self.metrics:
            name = metric if metric in self.metrics else next(iter(self.metrics))
            value = self.metrics[name]
            said += f", {name} {value:.4f}" if isinstance(value, (int, float)) else f", {name} {value}"
        if self.reason:
            said += f": {self.reason}"
        if (
            self.log
            and self.state in ("failed", "cancelled", "stopped")
            and self.log.removeprefix("error: ") not in self.reason
        ):
            said += f" (log: {self.log})"
        job = f" (job {self.job})" if self.job else ""
        return f"{self.label}: {said}{job}"


def seen(job: Job, queue: dict[str, str] | None = None) -> Seen:
    """``job``'s run as its folder and ``queue`` (job id -> scheduler state, :func:`queue_states`) say."""
    run, folder = job.run, job.folder
    launched = _record(folder / LAUNCH_FILE, "the launch record") or {}
    state = _record(folder / STATE_FILE, "the run's state") or {}
    found = Seen(job.label, run, "not started", job=str(launched.get("job", launched.get("pid", ""))))
    _progress(found, run)
    if (run / "result.json").is_file():
        found.state, found.metrics = "finished", _result_metrics(run)
        return found
    resubmitted = launched.get("at", 0) > state.get("at", 0)  # a state older than the launch is an earlier try's
    scheduled = (queue or {}).get(found.job) if found.job else None
    if launched and _live(launched, scheduled):
        if scheduled in QUEUED:
            found.state = "pending"
        else:  # a command line's run (no state of its own) is running once it logs a step
            said = state.get("state") == "running" and not resubmitted
            found.state = "running" if said or (not state and found.step is not None) else "starting"
        return found
    if state and not resubmitted and state.get("state") in ("stopped", "failed"):
        found.state, found.reason = state["state"], str(state.get("reason", ""))
    elif launched:  # left its queue without a word from the run
        ended = scheduled or launched.get("ended", "")
        found.state = "cancelled" if "CANCEL" in str(ended) else "failed"
        when = (
            " while the run was running"
            if state.get("state") == "running"
            else ""
            if (run / "run.json").is_file()
            else " before the run started"
        )
        found.reason = (f"the job ended ({ended})" if ended else "the job ended") + when
    elif (run / "run.json").is_file():
        found.state = "unfinished"
    found.log = last_line(Path(launched.get("log", folder / LOG_FILE))) if launched else ""
    return found


def _live(launched: dict, scheduled: str | None) -> bool:
    if launched.get("launcher") == "slurm":
        return scheduled is not None and (scheduled in QUEUED or scheduled in RUNNING)
    pid, host = launched.get("pid"), launched.get("host")
    return host == socket.gethostname() and isinstance(pid, int) and "ended" not in launched and alive(pid)


def _record(path: Path, what: str) -> dict | None:
    try:
        return read_record(path, what, limit=1_000_000)
    except LaunchError:
        return None  # being written by the run as we read (atomically: never half), or damaged: shown as unknown


def _progress(found: Seen, run: Path) -> None:
    """The last train row's step and loss, and the run's steps."""
    for line in reversed(tail(run / "metrics.jsonl").splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int):
            found.step, loss = row["step"], row.get("loss")
            found.loss = float(loss) if isinstance(loss, (int, float)) else None
            break
    record = _record(run / "run.json", "the run record")
    if record and isinstance(record.get("steps"), int):
        found.steps = record["steps"]


def _result_metrics(run: Path) -> dict[str, Any]:
    record = _record(run / "result.json", "the run's result") or {}
    metrics = record.get("metrics")
    return metrics if isinstance(metrics, dict) else {}


def tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of ``path`` as text (nothing when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_line(path: Path) -> str:
    """The last line of a log that says something (progress bars' carriage returns split too)."""
    lines = [line.strip() for line in tail(path).replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def queue_states(jobs: list[Job]) -> dict[str, str]:
    """SLURM's state of every SLURM job the runs were launched as (``squeue``: jobs it still holds); local
    processes are asked one by one by :func:`seen`."""
    ids = []
    for job in jobs:
        launched = _record(job.folder / LAUNCH_FILE, "the launch record") or {}
        if launched.get("launcher") == "slurm" and launched.get("job"):
            ids.append(str(launched["job"]))
    if not ids or shutil.which("squeue") is None:
        return {}
    try:
        found = subprocess.run(
            ["squeue", "-h", "-r", "-j", ",".join(sorted(set(ids))), "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in found.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def survey(jobs: list[Job]) -> list[Seen]:
    """Every run of ``jobs`` as it is now."""
    queue = queue_states(jobs)
    return [seen(job, queue) for job in jobs]


class Display:
    """The runs' lines, live: on a terminal redrawn in place; otherwise a line when a run's state changes."""

    def __init__(self, metric: str | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.metric = metric
        self.live = self.stream.isatty()
        self.drawn = 0
        self.said: dict[str, str] = {}

    def show(self, runs: list[Seen]) -> None:
        if self.live:
            lines = [one.line(self.metric) for one in runs] + [f"{time.strftime('%H:%M:%S')}: {counts(runs)}"]
            width = shutil.get_terminal_size((120, 20)).columns
            up = f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""
            self.stream.write(up + "\n".join(line[: width - 1] for line in lines) + "\n")
            self.stream.flush()
            self.drawn = len(lines)
            return
        for one in runs:
            if self.said.get(one.label) != one.state:
                self.said[one.label] = one.state
                print(one.line(self.metric), file=self.stream, flush=True)


def counts(runs: list[Seen]) -> str:
    """``3 finished, 1 failed``: how many runs are in each state, in the order they are first met."""
    states: dict[str, int] = {}
    for one in runs:
        states[one.state] = states.get(one.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in states.items())
