"""Named presets: ``zoo/*.yaml`` (sizes from the papers) and ``specs/*.yaml`` (architectures).

``locate("crate-base")`` finds ``zoo/crate-base.yaml``; a path to an existing file is used as is.
In a source checkout the folders sit beside the package; in a wheel they are packaged inside it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import Location, Problem, SpecError, did_you_mean

_PACKAGE = Path(__file__).resolve().parent.parent  # crate_compose/


def shipped_folder(name: str) -> Path:
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


def zoo_dir() -> Path:
    return shipped_folder("zoo")


def specs_dir() -> Path:
    return shipped_folder("specs")


def presets() -> dict[str, Path]:
    """Zoo presets and specs by name (zoo first: its names are the published model names)."""
    found: dict[str, Path] = {}
    for folder in (zoo_dir(), specs_dir()):
        for path in sorted(folder.glob("*.yaml"), key=lambda path: path.stem):  # by name (bert-mini, then
            found.setdefault(path.stem, path)  # bert-mini-classify; the file names sort the other way round)
    return found


def locate(ref: str | Path, relative_to: Path | None = None) -> Path:
    """A spec file path for ``ref``: an existing file, else a preset name (``crate-base``)."""
    candidate = Path(ref)
    if relative_to is not None and not candidate.is_absolute():
        candidate = relative_to / candidate
    if candidate.is_file():
        return candidate.resolve()
    if candidate.exists() and (candidate.suffix or "/" in str(ref) or candidate.is_absolute()):
        return candidate.resolve()  # a directory, a FIFO, a device: the reader says what it is
    name = Path(str(ref)).name.removesuffix(".yaml").removesuffix(".yml")
    known = presets()
    if name in known and ("/" not in str(ref) or not Path(ref).suffix):
        return known[name]
    if candidate.suffix in (".yaml", ".yml") or "/" in str(ref):
        message = f"no such spec file: {candidate}"
    else:
        message = f"'{ref}' is neither a spec file nor a zoo preset; presets: {', '.join(known)}"
    raise SpecError([Problem(message, (), Location(str(ref)), did_you_mean(name, known))])
