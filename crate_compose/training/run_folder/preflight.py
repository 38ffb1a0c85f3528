"""The refusals a training command can make before torch loads (about 2 s of start-up): a run or ablation
folder that cannot take what the command writes, a spec whose input does not fit the command (the output
folders of every command, and what may never be written into a build, are
:mod:`crate_compose.building.outputs`'s).

The command line calls these first; the commands check again where they write (under the folder's
lock, :mod:`.locks`), with the same functions and messages, so the Python API refuses alike. An
output path that cannot take the output (a file where a folder goes, a folder of someone else's
files) is an :class:`~crate_compose.errors.OutputError` (exit status 1, as a full disk or a FIFO given
as ``--out``); a spec or an argument that cannot be used is status 2.

Torch-free: only the standard library, the output folders' checks and the run records.
"""

from __future__ import annotations

from pathlib import Path

from ... import tasks
from ...building.outputs import output_folder
from ...errors import OutputError, WorkbenchError
from . import identity
from .eventlog import FOLDER as EVENTS_FOLDER
from .locks import LOCK_FILE

ABLATION_FILE = "ablation.json"  # an ablation folder's record of its grid (ablation.study)
RUN_FOLDERS = ("checkpoints", "final", "probes", EVENTS_FOLDER)  # what a run keeps as folders


def run_folder(run: Path) -> None:
    """A run folder ``train`` may write into: missing, empty or a run's; no file where a run keeps a folder.
    Refused with :class:`OutputError`, nothing there changed (whether it holds *this* run is the run
    record's to say: :mod:`.runs`)."""
    run = Path(run)
    output_folder(run, "the run (--out)")
    foreign = identity.foreign_entries(run)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputError(
            f"{run} holds files that are not a crate-compose run ({shown}); it is left alone: choose another --out"
        )
    kept_folders(run)


def kept_folders(run: Path) -> None:
    """Refuse a file where the run keeps a folder (``checkpoints``, ``final``, ``probes``, ``tensorboard``)."""
    for name in RUN_FOLDERS:
        if (run / name).exists() and not (run / name).is_dir():
            raise OutputError(f"{run / name} is a file where the run keeps a folder; move it away")


def ablation_folder(out: Path) -> None:
    """A folder ``ablate`` may write into: missing, or holding nothing but an ablation (its record,
    ``ablation.json``, whose grid is :mod:`.ablation`'s to compare) or a lock."""
    out = Path(out)
    output_folder(out, "the ablation (--out)")
    if not out.is_dir() or (out / ABLATION_FILE).exists() or (out / ABLATION_FILE).is_symlink():
        return
    foreign = sorted(e.name for e in out.iterdir() if e.name != LOCK_FILE)
    if foreign:
        raise OutputError(
            f"{out} holds files that are not an ablation ({', '.join(foreign[:5])}); it is left "
            "alone: choose another --out"
        )


def takes_token_ids(spec) -> bool:
    """Whether ``spec``'s input is token ids (``input: {shape: [N], dtype: int64}``)."""
    return spec.input.dtype == "int64" and len(spec.input.shape) == 1


def check_language_model(spec) -> None:
    """Refuse a spec whose input is not token ids (an image model has nothing to continue)."""
    if not takes_token_ids(spec):
        raise WorkbenchError(
            f"spec '{spec.name}' is not a language model (input {spec.input.shape}, {spec.input.dtype}); generate "
            "takes a spec whose input is token ids (input: {shape: [N], dtype: int64})"
        )


def check_task_input(spec, task: "tasks.Task") -> None:
    """A task's refusal of the spec's input from the spec alone (``train --task lm`` needs token ids; the
    data sets the shape later), as :func:`crate_compose.training.run.train` refuses it after loading."""
    task.check_input(spec)


def check_task_head(spec, task: "tasks.Task") -> None:
    """A task's refusal of a spec whose head is another task's (a SimDINO head trained as a classifier), from the
    spec alone, before torch loads (the check every task makes, :meth:`crate_compose.tasks.Task.check_head`; what
    depends on the data is said once it is loaded)."""
    tasks.Task.check_head(task, spec)


__all__ = [
    "ABLATION_FILE",
    "ablation_folder",
    "check_language_model",
    "check_task_head",
    "check_task_input",
    "kept_folders",
    "run_folder",
    "takes_token_ids",
]
