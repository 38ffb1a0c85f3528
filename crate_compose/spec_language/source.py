"""Reading a spec file: raw data and the file:line:column of every key, as a :class:`Source`.

A spec is a YAML mapping, read by :mod:`crate_compose.spec_language.yamlread` (plain values only,
bounded in size, nesting and alias expansion)::

    name: crate-tiny          # Source.data["name"] == "crate-tiny"
    sizes: {d: 64}            # Source.marks[("sizes", "d")] == Location("tiny.yaml", 2, 9)

Every later stage (``extends``, ``--set`` overrides, ``${size}`` references, validation) works on
a :class:`Source` and records in it what it changed, so that a problem is reported where it was
written. A file that cannot be read (a directory, too large, not UTF-8) is a located problem too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import Location, Problem, SpecError
from . import yamlread

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Swap:
    """A step whose primitive an override or a patch replaced: what it was, and which of its
    arguments came along unasked (those the new primitive does not take are dropped, with a note)."""

    primitive: str
    args: dict
    inherited: tuple[str, ...]  # sorted


@dataclass
class Source:
    """Raw spec data and where each key of it came from."""

    data: Any
    marks: dict[KeyPath, Location] = field(default_factory=dict)
    unresolved: set[KeyPath] = field(default_factory=set)  # values whose ${reference} failed
    via: dict[KeyPath, str] = field(default_factory=dict)  # values that are a whole ${size} reference
    swaps: dict[KeyPath, Swap] = field(default_factory=dict)  # steps whose primitive was replaced
    notes: list[str] = field(default_factory=list)

    def locate(self, path: KeyPath) -> Location | None:
        """The location of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None

    def origin(self, path: KeyPath) -> str:
        """`` (= ${d}, given at FILE:LINE:COL)`` for a value that came from a size, else ``""``."""
        if path not in self.via:
            return ""
        name = self.via[path]
        return f" (= ${{{name}}}, given at {self.locate(('sizes', name))})"


def read_yaml(text: str, source: str) -> Source:
    """Parse YAML keeping the location of every key and list item (:mod:`crate_compose.spec_language.yamlread`:
    plain values only, bounded in size, nesting and alias expansion); duplicate keys are problems."""
    parsed = yamlread.parse(text, source)
    if not isinstance(parsed.data, dict):
        found = type(parsed.data).__name__
        raise SpecError([Problem(f"a spec is a mapping of keys; found {found}", (), parsed.marks[()])])
    return Source(parsed.data, parsed.marks)


def read_file(path: Path) -> Source:
    try:
        if not path.is_file():  # a directory, a FIFO, a device such as /dev/zero
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise SpecError([Problem(f"cannot read spec file: {kind}", (), Location(str(path)))])
        size = path.stat().st_size
        if size > yamlread.MAX_BYTES:
            raise SpecError(
                [
                    Problem(
                        f"the file is {size:,} bytes; a spec is at most {yamlread.MAX_BYTES:,}", (), Location(str(path))
                    )
                ]
            )
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError([Problem(f"cannot read spec file: {error.strerror}", (), Location(str(path)))]) from None
    except UnicodeDecodeError as error:
        before = error.object[: error.start]
        where = Location(str(path), before.count(b"\n") + 1, error.start - before.rfind(b"\n"))
        found = error.object[error.start : error.start + 1]
        raise SpecError([Problem(f"a spec is UTF-8 text; {error.reason} {found!r}", (), where)]) from None
    return read_yaml(text, str(path))


def key_values(data: Any, prefix: KeyPath = ()) -> Iterable[tuple[KeyPath, Any]]:
    """Every key path in raw spec data with its value: the root ``()`` first, then depth first in the order written."""
    yield prefix, data
    if isinstance(data, dict):
        for key, value in data.items():
            yield from key_values(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from key_values(value, prefix + (i,))


def key_paths(data: Any, prefix: KeyPath = ()) -> Iterable[KeyPath]:
    """Every key path in raw spec data, the root ``()`` first, then depth first in the order written."""
    return (path for path, _ in key_values(data, prefix))


def is_steps(value: Any) -> bool:
    """A list of steps (mappings with a name)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and "name" in v for v in value)
