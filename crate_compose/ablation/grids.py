"""Ablation grids: what to cross and how to train it, checked as a whole before anything is built.

A grid comes from a grid file (``crate-compose ablate SPEC --grid FILE``), the command line, or
Python (:class:`Grid`)::

    swaps:                                   # each path and the values to try; the grid crosses them
      encoder.layer.sparsify.primitive: [ista, ista_soft, ista_mm]
    seeds: 3                                 # seeds 0..2 of every variant (1 to 100)
    set: [sizes.depth=2]                     # overrides every variant shares
    steps: 600                               # and any training setting but seed (task, data, lr, ...)

The text goes through the spec reader (:func:`crate_compose.spec_language.source.read_file`: a regular file, at
most 2 MB, UTF-8; :mod:`crate_compose.spec_language.yamlread`: plain values only, bounded nesting, values and
aliases), so ``/dev/zero``, a FIFO or an alias bomb is refused at once. Every problem is reported
together as ``file:line:column: key: message``; the training settings follow the rules of
:func:`crate_compose.tasks.settings_problems`, the same the Python API's ``train`` refuses by.
The command line wins over the file: a ``--swap`` replaces the file's values of its path, ``--seeds``
and the training options replace the file's, ``--set`` comes after its ``set``. A value listed
twice is trained once (:attr:`Grid.notes` says so). A grid of more than
:data:`crate_compose.settings.MAX_RUNS` runs (variants times seeds) is refused from the lengths of its
lists, before any variant is made.

Torch-free: the command line checks a grid before the heavy modules load.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import Location, Problem, SpecError, WorkbenchError, did_you_mean
from ..settings import MAX_RUNS, MAX_SEEDS, Settings, settings_of
from ..spec_language.source import Source, read_file
from ..tasks import settings_problems
from ..training.recipes import setting_keys

KeyPath = tuple[str | int, ...]
OWN_KEYS = ("swaps", "seeds", "set")


def grid_keys() -> tuple[str, ...]:
    """The keys a grid file may hold: its own and every run setting but ``seed`` (a grid's seeds are 0..seeds-1)."""
    return (*OWN_KEYS, *(name for name in setting_keys() if name != "seed"))


SWAPS_EXAMPLE = "swaps: {PATH: [a, b, ...]}, e.g. encoder.layer.sparsify.primitive: [ista, ista_soft]"


class GridError(SpecError):
    """Problems in a grid (its file, ``--swap``, or its variants), each located (the CLI exits with status 2)."""

    def __str__(self) -> str:
        count = len(self.problems)
        return "\n".join(
            [f"{count} problem{'s' if count != 1 else ''} in the ablation grid:", *(f"  {p}" for p in self.problems)]
        )


@dataclass
class Grid:
    """An ablation: the swaps to cross, and how to train each variant.

    Checked when made (:func:`grid_problems`, then :func:`check_size`), raising :class:`GridError`;
    every value becomes text (``2`` -> ``"2"``) and a value listed twice is kept once (``notes``).
    ``origins`` says where each override (``PATH=VALUE``) was written, for messages; it is not part
    of the grid's identity."""

    swaps: dict[str, list[str]]
    settings: Settings = field(default_factory=Settings)
    seeds: int = 1
    overrides: list[str] = field(default_factory=list)
    origins: dict[str, Location] = field(default_factory=dict, repr=False, compare=False)
    notes: list[str] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = grid_problems(self.swaps, self.seeds, self.overrides, self.settings)
        if problems:
            raise GridError([Problem(message, key) for key, message in problems])
        self.swaps, self.notes = unique(self.swaps)
        self.overrides = list(self.overrides)
        check_size(self.swaps, self.seeds)

    def variants(self) -> list[dict[str, str]]:
        """Every combination of the swaps, in order (``{path: value}``)."""
        paths = list(self.swaps)
        return [dict(zip(paths, values)) for values in itertools.product(*(self.swaps[p] for p in paths))]

    def assignments(self, variant: dict[str, str]) -> list[str]:
        """The overrides that make ``variant``: the grid's own, then its swaps."""
        return [*self.overrides, *(f"{path}={value}" for path, value in variant.items())]


def grid_problems(
    swaps: Any, seeds: Any, sets: Any, settings: Settings, given: Iterable[str] | None = None
) -> list[tuple[KeyPath, str]]:
    """``(key path, message)`` for every part of a grid that cannot be used; of the settings, the
    fields in ``given`` (a grid file's, or all), by :func:`crate_compose.tasks.settings_problems`."""
    problems = swap_problems(swaps)
    if not (isinstance(seeds, int) and not isinstance(seeds, bool) and 1 <= seeds <= MAX_SEEDS):
        problems.append((("seeds",), f"{seeds!r} is not a whole number of seeds in [1, {MAX_SEEDS}]"))
    if not (isinstance(sets, (list, tuple)) and all(isinstance(s, str) and "=" in s for s in sets)):
        problems.append((("set",), "give a list of PATH=VALUE overrides, e.g. [sizes.depth=2]"))
    if settings.seed != 0:
        problems.append(
            (
                ("seed",),
                f"a grid trains seeds 0..seeds-1, so its settings keep seed 0 (not "
                f"{settings.seed!r}); give seeds: N (--seeds N)",
            )
        )
    given = set(grid_keys() if given is None else given)
    return problems + [((name,), message) for name, message in settings_problems(settings) if name in given]


def swap_problems(swaps: Any) -> list[tuple[KeyPath, str]]:
    """``swaps`` must map key paths to non-empty lists of values (or ``"a,b,c"``)."""
    if not isinstance(swaps, dict) or not swaps:
        return [(("swaps",), f"give the steps to swap: {SWAPS_EXAMPLE}")]
    problems: list[tuple[KeyPath, str]] = []
    for path, values in swaps.items():
        if not isinstance(path, str) or not path.strip() or "=" in path:
            problems.append(
                (
                    ("swaps", str(path)) if str(path) else ("swaps",),
                    f"{path!r} is not a key path such as encoder.layer.sparsify.primitive",
                )
            )
        elif _values(values) is None:
            problems.append((("swaps", path), "give a non-empty list of values (text or numbers), or 'a,b,c'"))
    return problems


def _values(values: Any) -> list[str] | None:
    """A swap's values as text, or None when they are not a non-empty list of non-empty plain values."""
    if isinstance(values, str):
        values = [v.strip() for v in values.split(",") if v.strip()]
    if not isinstance(values, list) or not values or not all(isinstance(v, (str, int, float)) for v in values):
        return None
    texts = [str(v).lower() if isinstance(v, bool) else str(v).strip() for v in values]
    return texts if all(texts) else None


def unique(swaps: dict[str, Any]) -> tuple[dict[str, list[str]], list[str]]:
    """Each swap's values as text, each once (in the order first given), and a note for every path
    that listed a value more than once."""
    kept, notes = {}, []
    for path, values in swaps.items():
        counts = Counter(_values(values))
        twice = [value for value, count in counts.items() if count > 1]
        if twice:
            notes.append(f"swaps.{path}: {', '.join(twice)} listed more than once; trained once")
        kept[path] = list(counts)
    return kept, notes


def check_size(swaps: dict[str, list[str]], seeds: int) -> None:
    """Refuse a grid of more than :data:`~crate_compose.settings.MAX_RUNS` runs, counted from the lengths alone."""
    runs = math.prod(len(values) for values in swaps.values()) * seeds
    if runs > MAX_RUNS:
        counts = " x ".join(str(len(v)) for v in swaps.values())
        seeds_said = f"{seeds} seed{'s' * (seeds != 1)}"
        raise GridError(
            [
                Problem(
                    f"the grid has {runs:,} runs ({counts} values x {seeds_said}); at most {MAX_RUNS} "
                    "are trained by one ablate",
                    ("swaps",),
                    None,
                    "split it into several grids",
                )
            ]
        )


def parse_swap(text: str) -> tuple[str, list[str]]:
    """``encoder.layer.sparsify.primitive=ista,ista_soft`` -> ``("encoder.layer.sparsify.primitive", [...])``."""
    path, _, values = text.partition("=")
    choices = _values(values)
    if not path.strip() or not choices:
        raise GridError(
            [Problem("write PATH=a,b,c, e.g. encoder.layer.sparsify.primitive=ista,ista_soft", (), swap_origin(text))]
        )
    return path.strip(), choices


def swap_origin(text: str) -> Location:
    """Where a ``--swap`` argument was written."""
    return Location(f"--swap {text!r}")


# ---------------------------------------------------------------- grid files


@dataclass
class GridFile:
    """A grid file's content, checked (:func:`read_grid`), and where each of its values was written."""

    path: Path
    content: dict[str, Any]
    source: Source

    def locate(self, *key: str | int) -> Location:
        return self.source.locate(key) or Location(str(self.path))

    def settings(self) -> dict[str, Any]:
        return {k: self.content[k] for k in grid_keys()[len(OWN_KEYS) :] if k in self.content}

    def origins(self) -> dict[str, Location]:
        """``{PATH=VALUE: location}`` for every swap value and ``set`` item of the file."""
        found: dict[str, Location] = {}
        for path, values in self.content.get("swaps", {}).items():
            listed = isinstance(values, list)
            for i, value in enumerate(_values(values)):
                found.setdefault(f"{path}={value}", self.locate("swaps", path, *((i,) if listed else ())))
        for i, assignment in enumerate(self.content.get("set", [])):
            found.setdefault(assignment, self.locate("set", i))
        return found


def read_grid(path: str | Path) -> GridFile:
    """Read and check a grid file (see the module docstring); :class:`GridError` lists every problem."""
    path = Path(path)
    try:
        source = read_file(path)
    except SpecError as error:
        raise GridError(error.problems) from None
    found = GridFile(path, source.data, source)
    problems = [
        Problem(f"unknown key '{key}'", (key,), found.locate(key), _key_hint(key))
        for key in source.data
        if key not in grid_keys()
    ]
    given = found.settings()
    settings = settings_of(given)
    problems += [
        Problem(message, key, found.locate(*key))
        for key, message in grid_problems(
            source.data.get("swaps"), source.data.get("seeds", 1), source.data.get("set", []), settings, given
        )
    ]
    if problems:
        raise GridError(sorted(problems, key=lambda p: (p.location.line, p.location.column)))
    return found


def _key_hint(key: str) -> str:
    if key == "seed":
        return "a grid's seeds are 0..seeds-1: give 'seeds: N'"
    return did_you_mean(key, grid_keys()) or f"expected some of: {', '.join(grid_keys())}"


def combine(
    found: GridFile | None,
    swaps: list[str],
    sets: list[str],
    seeds: int | None,
    settings: Settings,
    recipe: tuple[str, list[str]] | None = None,
) -> Grid:
    """The grid of a grid file and the command line (``--swap`` arguments, ``--set`` overrides,
    ``--seeds``; ``settings`` already merged), the command line winning (see the module docstring);
    ``recipe`` (its name and its spec overrides) comes first, so the grid file and the command line
    win over it. :attr:`Grid.notes` also says which of the file's swaps a ``--swap`` replaced."""
    content = found.content if found else {}
    crossed = dict(content.get("swaps", {}))
    origins = found.origins() if found else {}
    replaced = []
    for text in swaps:
        path, values = parse_swap(text)
        if path in crossed:
            replaced.append(f"--swap {path}: replaces the grid file's values of that path")
        crossed[path] = values
        origins.update({f"{path}={value}": swap_origin(text) for value in values})
    if not crossed:
        raise WorkbenchError("ablate needs something to swap: --swap PATH=a,b,c or --grid FILE")
    origins.update({assignment: Location(f"--set {assignment!r}") for assignment in sets})
    name, first = recipe or ("", [])
    for assignment in first:
        origins.setdefault(assignment, Location(f"--config {name}: set {assignment!r}"))
    grid = Grid(
        crossed,
        settings,
        seeds=seeds or content.get("seeds", 1),
        overrides=[*first, *content.get("set", []), *sets],
        origins=origins,
    )
    grid.notes[:0] = replaced
    return grid
