"""Ablation grid files, read like specs: safe, bounded, every problem located.

A grid file (``crate-compose ablate SPEC --grid FILE``)::

    swaps:                                   # each path and the values to try; the grid crosses them
      encoder.layer.sparsify.primitive: [ista, ista_soft, ista_mm]
    seeds: 3                                 # seeds 0..2 of every variant (1 to 100)
    set: [sizes.depth=2]                     # overrides every variant shares
    steps: 600                               # and any training setting but seed (task, data, lr, ...)

The text goes through the spec reader (:func:`crate_compose.loader.read_file`: a regular file, at
most 2 MB, UTF-8; :mod:`crate_compose.yamlread`: plain values only, bounded nesting, values and
aliases), so ``/dev/zero``, a FIFO or an alias bomb is refused at once. Every problem is reported
together as ``file:line:column: key: message``; the training settings follow the rules of
:func:`crate_compose.settings.settings_problems`. A value listed twice is trained once. A grid of
more than :data:`MAX_RUNS` runs (variants times seeds) is refused before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from . import loader
from .errors import Location, Problem, SpecError, did_you_mean
from .settings import Settings, settings_problems

class GridError(SpecError):
    """Problems in a grid file or ``--swap``, each located (the CLI exits with status 2)."""

    def __str__(self) -> str:
        count = len(self.problems)
        return "\n".join([f"{count} problem{'s' if count != 1 else ''} in the ablation grid:",
                          *(f"  {p}" for p in self.problems)])


MAX_RUNS = 256  # variants x seeds: a day of laptop runs at a minute each is far fewer
MAX_SEEDS = 100
SETTING_KEYS = tuple(f.name for f in fields(Settings) if f.name != "seed")  # a grid's seeds are 0..seeds-1
KEYS = ("swaps", "seeds", "set", *SETTING_KEYS)


def parse_swap(text: str) -> tuple[str, list[str]]:
    """``encoder.layer.sparsify.primitive=ista,ista_soft`` -> ``("encoder.layer.sparsify.primitive", [...])``."""
    path, _, values = text.partition("=")
    choices = [v.strip() for v in values.split(",") if v.strip()]
    if not path.strip() or not choices:
        raise GridError([Problem("write PATH=a,b,c, e.g. encoder.layer.sparsify.primitive=ista,ista_soft", (),
                                 Location(f"--swap {text!r}"))])
    return path.strip(), choices


def read_grid(path: str | Path) -> tuple[dict[str, Any], dict]:
    """The grid file's content (validated, see the module docstring) and the location of every key."""
    source = loader.read_file(Path(path))
    data, problems = source.data, []

    def where(*key) -> Location:
        return source.locate(key) or Location(str(path))

    if not isinstance(data, dict):
        raise GridError([Problem("a grid file is a mapping with 'swaps: {PATH: [a, b, ...]}'", (), where())])
    for key in data:
        if key not in KEYS:
            hint = did_you_mean(key, KEYS) or ("a grid's seeds are 0..seeds-1: give 'seeds: N'" if key == "seed"
                                               else f"expected some of: {', '.join(KEYS)}")
            problems.append(Problem(f"unknown key '{key}'", (key,), where(key), hint))
    swaps = data.get("swaps")
    if not isinstance(swaps, dict) or not swaps:
        problems.append(Problem("give the steps to swap: swaps: {PATH: [a, b, ...]}", ("swaps",), where("swaps")))
    else:
        for key, values in swaps.items():
            if not _values(values):
                problems.append(Problem("give a list of values (or 'a,b,c')", ("swaps", key), where("swaps", key)))
    seeds = data.get("seeds", 1)
    if not (isinstance(seeds, int) and not isinstance(seeds, bool) and 1 <= seeds <= MAX_SEEDS):
        problems.append(Problem(f"{seeds!r} is not a whole number of seeds in [1, {MAX_SEEDS}]", ("seeds",),
                                where("seeds")))
    sets = data.get("set", [])
    if not (isinstance(sets, list) and all(isinstance(s, str) and "=" in s for s in sets)):
        problems.append(Problem("give a list of PATH=VALUE overrides", ("set",), where("set")))
    given = {k: data[k] for k in SETTING_KEYS if k in data}
    for name, message in settings_problems(replace(Settings(), **given)):
        if name in given:
            problems.append(Problem(message, (name,), where(name)))
    if problems:
        raise GridError(problems)
    return data, source.marks


def _values(values: Any) -> list[str] | None:
    if isinstance(values, str):
        values = [v.strip() for v in values.split(",") if v.strip()]
    if not isinstance(values, list) or not values or any(isinstance(v, (dict, list)) or v is None for v in values):
        return None
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in values]


def swaps_of(content: dict[str, Any], given: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The swaps of a grid file and of ``--swap`` arguments (the command line wins for a path given
    in both), each value once; returns them and notes of what was dropped."""
    swaps = {path: _values(values) for path, values in (content.get("swaps") or {}).items()}
    notes = []
    for text in given:
        path, values = parse_swap(text)
        if path in swaps:
            notes.append(f"--swap {path}: replaces the grid file's values for that path")
        swaps[path] = values
    for path, values in swaps.items():
        unique = list(dict.fromkeys(values))
        if len(unique) != len(values):
            twice = sorted({v for v in values if values.count(v) > 1})
            notes.append(f"{path}: {', '.join(twice)} listed more than once; trained once")
        swaps[path] = unique
    return swaps, notes


def check_size(swaps: dict[str, list[str]], seeds: int) -> None:
    """Refuse a grid of more than :data:`MAX_RUNS` runs, counted from the lengths alone."""
    runs = math.prod(len(values) for values in swaps.values()) * seeds
    if runs > MAX_RUNS:
        counts = " x ".join(str(len(v)) for v in swaps.values())
        raise GridError([Problem(f"the grid has {runs:,} runs ({counts} variants x {seeds} seeds); at most "
                                 f"{MAX_RUNS} are trained by one ablate", (), Location("swaps"),
                                 "split it into several grids")])
