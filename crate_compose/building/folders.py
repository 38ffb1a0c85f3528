"""What a build folder holds, and whether a folder may be replaced by a build. Torch-free, so that the
command line refuses an ``--out`` that cannot take a build before torch loads (``crate-compose build
SPEC --out .`` answers in a fraction of a second, not after the weights are built).

:mod:`.artifacts` writes and reads build folders with these names."""

from __future__ import annotations

from pathlib import Path

from ..settings import DIAGRAM_STEM

SPEC_FILE, WEIGHTS_FILE, CODE_FILE, SUMMARY_FILE = "spec.yaml", "model.safetensors", "code.py", "summary.txt"
BUILD_FILES = frozenset({SPEC_FILE, WEIGHTS_FILE, CODE_FILE, SUMMARY_FILE})


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
