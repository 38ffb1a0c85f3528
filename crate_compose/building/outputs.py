"""Output folders: what a build folder holds, whether a folder may be replaced by a build, and where a
command's outputs may go (a folder, not under a file; never inside a build, nor inside the folder a command
reads). Torch-free, so that the command line refuses an ``--out`` that cannot take its output before torch
loads (``crate-compose build SPEC --out .`` answers in a fraction of a second, not after the weights are built).
An output path that cannot take the output is an :class:`~crate_compose.errors.OutputError` (exit status 1);
an ``--out`` a command may not write (inside a build, inside its source) is status 2.

:mod:`.artifacts` writes and reads build folders with these names; run and ablation folders are
:mod:`crate_compose.training.run_folder.preflight`'s."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from ..errors import OutputError, WorkbenchError
from ..files import writable
from ..settings import DIAGRAM_STEM

SPEC_FILE, WEIGHTS_FILE, CODE_FILE, SUMMARY_FILE = "spec.yaml", "model.safetensors", "code.py", "summary.txt"
BUILD_FILES = frozenset({SPEC_FILE, WEIGHTS_FILE, CODE_FILE, SUMMARY_FILE})
PROBE_FILES = ("probes.json", "probes.png")


class OutputExistsError(FileExistsError):
    """The output directory holds files that are not an earlier build: it is not replaced (an ``OSError``:
    exit status 1, as an output that cannot be written)."""


def replaceable(directory: Path) -> None:
    """Raise unless ``directory`` is missing, empty or an earlier build that may be replaced."""
    directory = Path(directory)
    if not directory.exists():
        above = next((p for p in directory.parents if p.exists()), None)  # a path under a file or a device
        if above is not None and not above.is_dir():
            raise OutputExistsError(f"{above} exists and is not a directory, so {directory} cannot be made there")
        return
    if not directory.is_dir():
        raise OutputExistsError(f"{directory} exists and is not a directory")
    foreign = sorted(entry.name for entry in directory.iterdir() if not _written_by_a_build(entry))
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputExistsError(
            f"{directory} holds files that are not a crate-compose build ({shown}); "
            "it is left alone: choose another --out"
        )


def _written_by_a_build(entry: Path) -> bool:
    return entry.is_file() and (entry.name in BUILD_FILES or entry.stem == DIAGRAM_STEM)


def is_build(folder: Path) -> bool:
    """Whether ``folder`` holds a build (its weights and its spec)."""
    return (Path(folder) / WEIGHTS_FILE).is_file() and (Path(folder) / SPEC_FILE).is_file()


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
        raise OutputError(
            f"{where}: {above} exists and is not a folder, so no folder can be made under it: give a folder for {what}"
        )
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{where} exists and is not a folder: give a folder for {what}")


def outside_builds(folder: Path, where: str, what: str, inside: Iterable[Path] = ()) -> None:
    """Refuse (status 2) a ``folder`` inside a build (a folder holding model.safetensors and spec.yaml) or
    inside one of ``inside`` (resolved): ``train --resume`` takes ``final/`` only when it holds a build
    and nothing else."""
    inside = [Path(p).resolve() for p in inside]
    resolved = Path(folder).resolve()
    for place in (resolved, *resolved.parents):
        if place in inside or is_build(place):
            raise WorkbenchError(
                f"{where} is inside the {'weights folder' if place in inside else 'build'} {place}: "
                f"{what} are never written into a build (train --resume would refuse its final/); "
                "choose a folder outside it"
            )


def check_probe_folder(folder: Path, where: str) -> None:
    """A folder ``probe`` may write probes.json and probes.png into (see :func:`outside_builds`,
    :func:`output_folder`); a probes.json or probes.png that is not a regular file is an ``OSError``."""
    outside_builds(folder, where, "probes")
    output_folder(folder, "probes.json and probes.png", where)
    for name in PROBE_FILES:
        writable(Path(folder) / name)


def check_picture_folder(folder: Path, where: str, weights: Path | None = None) -> None:
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
        raise WorkbenchError(
            f"--out {out} is inside the folder it exports ({source}): the export would overwrite "
            f"what it reads; give a file outside {source}"
        )
