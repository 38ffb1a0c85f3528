"""The refusals a command can make before torch loads (about 2 s of start-up): an output folder that
cannot take what the command writes, a spec whose input does not fit the command, an ``--out`` that
would overwrite the command's own source.

The command line calls these first; the commands check again where they write (under the folder's
lock, :mod:`.locks`), with the same functions and messages, so the Python API refuses alike. An
output path that cannot take the output (a file where a folder goes, a folder of someone else's
files) is an :class:`~crate_compose.errors.OutputError` (exit status 1, as a full disk or a FIFO given
as ``--out``); a spec or an argument that cannot be used is status 2.

Torch-free: only the standard library, the build folder's names and the run records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .. import tasks
from ..building.folders import WEIGHTS_FILE, is_build
from ..errors import OutputError, WorkbenchError
from ..files import writable
from . import identity
from .eventlog import FOLDER as EVENTS_FOLDER
from .locks import LOCK_FILE

ABLATION_FILE = "ablation.json"  # an ablation folder's record of its grid (ablation.study)
RUN_FOLDERS = ("checkpoints", "final", "probes", EVENTS_FOLDER)  # what a run keeps as folders
PROBE_FILES = ("probes.json", "probes.png")


def under_a_file(path: Path) -> Path | None:
    """The nearest existing folder above ``path`` when it is not a folder (a file, a device): ``path``
    cannot be made there. None when ``path`` exists or its nearest existing parent is a folder."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        return None
    above = next((p for p in path.parents if p.exists()), None)
    return above if above is not None and not above.is_dir() else None


def output_folder(folder: Path, what: str, where: str | None = None) -> None:
    """Refuse (:class:`OutputError`) a ``folder`` that exists as something else than a folder, or lies under
    a file: ``what`` says what goes there (``"the run (--out)"``); ``where`` names the folder as the user
    gave it (default: the path)."""
    folder = Path(folder)
    where = where or str(folder)
    above = under_a_file(folder)
    if above is not None:
        raise OutputError(f"{where}: {above} exists and is not a folder, so no folder can be made under it: give "
                          f"a folder for {what}")
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{where} exists and is not a folder: give a folder for {what}")


def run_folder(run: Path) -> None:
    """A run folder ``train`` may write into: missing, empty or a run's; no file where a run keeps a folder.
    Refused with :class:`OutputError`, nothing there changed (whether it holds *this* run is the run
    record's to say: :mod:`.runs`)."""
    run = Path(run)
    output_folder(run, "the run (--out)")
    foreign = identity.foreign_entries(run)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputError(f"{run} holds files that are not a crate-compose run ({shown}); it is left alone: "
                          "choose another --out")
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
        raise OutputError(f"{out} holds files that are not an ablation ({', '.join(foreign[:5])}); it is left "
                          "alone: choose another --out")


def outside_builds(folder: Path, where: str, what: str, inside: Iterable[Path] = ()) -> None:
    """Refuse (status 2) a ``folder`` inside a build (a folder holding model.safetensors and spec.yaml) or
    inside one of ``inside`` (resolved): ``train --resume`` takes ``final/`` only when it holds a build
    and nothing else."""
    inside = [Path(p).resolve() for p in inside]
    resolved = Path(folder).resolve()
    for place in (resolved, *resolved.parents):
        if place in inside or is_build(place):
            raise WorkbenchError(f"{where} is inside the {'weights folder' if place in inside else 'build'} {place}: "
                                 f"{what} are never written into a build (train --resume would refuse its final/); "
                                 "choose a folder outside it")


def probe_folder(folder: Path, where: str) -> None:
    """A folder ``probe`` may write probes.json and probes.png into (see :func:`outside_builds`,
    :func:`output_folder`); a probes.json or probes.png that is not a regular file is an ``OSError``."""
    outside_builds(folder, where, "probes")
    output_folder(folder, "probes.json and probes.png", where)
    for name in PROBE_FILES:
        writable(Path(folder) / name)


def picture_folder(folder: Path, where: str, weights: Path | None = None) -> None:
    """A folder ``show`` may write its pictures into: never inside a build or the weights folder."""
    outside_builds(folder, where, "pictures", [weights] if weights is not None else [])
    output_folder(folder, "the pictures", where)


def outside_source(source: Path, out: Path) -> None:
    """Refuse an ``--out`` file that is the source build's own weights, or any path inside the source
    folder (``export BUILD --out BUILD/model.safetensors`` would overwrite what it reads): status 2,
    before anything is read."""
    source, out = Path(source), Path(out)
    inside = Path(os.path.realpath(out))  # symbolic links followed, as the write would follow them
    folder = Path(os.path.realpath(source))
    same = False
    weights = source / WEIGHTS_FILE
    if out.exists() and weights.exists():
        try:
            same = os.path.samefile(out, weights)  # a hard link to the weights is the weights
        except OSError:
            same = False
    if same or inside == folder or folder in inside.parents:
        raise WorkbenchError(f"--out {out} is inside the folder it exports ({source}): the export would overwrite "
                             f"what it reads; give a file outside {source}")


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


def check_task_input(spec, task: str) -> None:
    """A task's refusal of the spec's input from the spec alone (``train --task lm`` needs token ids; the
    data sets the shape later), as :func:`crate_compose.training.run.train` refuses it after loading."""
    tasks.get(task).check_input(spec)


__all__ = ["ABLATION_FILE", "ablation_folder", "check_language_model",
           "check_task_input", "kept_folders", "output_folder", "outside_builds", "outside_source",
           "picture_folder", "probe_folder", "run_folder", "takes_token_ids", "under_a_file"]
