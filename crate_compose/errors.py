"""Errors a user can act on: every problem in a spec, located, reported together.

A :class:`SpecError` carries a list of :class:`Problem`; the CLI prints them one per line
(``file:line:column: key.path: message``) and exits with status 2. Nothing in the library
lets a Python traceback reach a user for a bad spec.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file position, or a command-line override."""

    source: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.source}:{self.line}:{self.column}"
        return self.source


def format_path(path: Path) -> str:
    """``("encoder", "layer", 0, "args")`` -> ``encoder.layer[0].args``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass
class Problem:
    """One thing wrong with a spec."""

    message: str
    path: Path = ()
    location: Location | None = None
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        key = f"{format_path(self.path)}: " if self.path else ""
        text = f"{where}{key}{self.message}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class SpecError(Exception):
    """A spec that cannot be built; ``problems`` lists every reason found."""

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the spec"
        return "\n".join([head + ":", *(f"  {p}" for p in self.problems)])


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A hint naming the closest valid choice, or '' when nothing is close."""
    matches = difflib.get_close_matches(str(word), sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else ""


def one_of(choices: Sequence[str], limit: int = 12) -> str:
    """'expected one of: a, b, c' (shortened for long lists)."""
    shown = ", ".join(sorted(choices)[:limit])
    more = f", ... ({len(choices) - limit} more)" if len(choices) > limit else ""
    return f"expected one of: {shown}{more}"


class WorkbenchError(ValueError):
    """A training, probing or ablation run that cannot start (bad task, data set, resume request).

    The CLI prints it in one line and exits with status 2.
    """


class OutputError(WorkbenchError):
    """An output folder given (or defaulted) that cannot take what a command writes: a file or a device
    where the folder goes, a folder of someone else's files, a file where a run keeps a folder. As an
    output that cannot be written (a full disk, a FIFO given as ``--out``, a build's ``--out .``), the CLI
    exits with status 1, the path named; nothing there is changed."""

    exit_status = 1


class PluginError(RuntimeError):
    """A package registered under ``crate_compose.primitives`` failed to import."""


class DiagramError(RuntimeError):
    """Graphviz could not draw the diagram."""


class TrainError(WorkbenchError):
    """A run that cannot start (bad task, data or resume request); the CLI prints it in one line."""


class Stopped(WorkbenchError):
    """A run stopped by a signal (SIGTERM) at a step's start, its checkpoints intact: ``state`` says after which
    step and the last checkpoint kept, ``advice`` how to continue; the message is both. The CLI prints it in
    one line and exits with status 128 + the signal's number (143 for SIGTERM), as a process the signal ended
    would."""

    def __init__(self, state: str, advice: str, *, signal: int = 15) -> None:
        super().__init__(f"{state}; {advice}")
        self.state, self.advice = state, advice
        self.signal = int(signal)
        self.exit_status = 128 + self.signal


class DataError(WorkbenchError):
    """A data set that cannot be loaded; the message is one line naming the data set, path or file."""
